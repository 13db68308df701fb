//! The device-resident path ([`Wgpu::record`]) behind the [`Attention`] trait, for `attn verify
//! --resident` and benchmarks: [`OnDevice`].

use crate::backend::{Wgpu, read_buffer};
use crate::resident::{DeviceInputs, DeviceOutputs, DeviceSequences, DeviceTensor};
use attn_core::{
    Attention, Availability, Buffer, DType, Data, Inputs, Numerics, Outputs, Plan, Prepared, Problem, Result,
};
use std::time::{Duration, Instant};
use wgpu::util::DeviceExt;

/// The device-resident path behind the [`Attention`] trait (`wgpu-resident`): `prepare` copies
/// the inputs (ALiBi's slopes and the index arrays of packed or paged sequences too) into buffers
/// of their own on the backend's device, as a caller's would be, and poisons the output; `run` calls [`Wgpu::submit`] on them and waits
/// (timed by the host clock); `read` copies o and the LSE back. Its results must equal the
/// `wgpu` backend's bit for bit.
#[derive(Default)]
pub struct OnDevice {
    wgpu: Wgpu,
}

impl OnDevice {
    /// The harness over `wgpu`.
    pub fn new(wgpu: Wgpu) -> Self {
        OnDevice { wgpu }
    }
}

/// A prepared call's buffers: q, k, v, o, the LSE (where asked for), the slopes (with ALiBi)
/// and the index arrays (`cu_seqlens_q`, `cu_seqlens_k`, `seqused_k`, `block_table`, where the
/// problem reads them).
struct OnDevicePrepared<'a> {
    harness: &'a OnDevice,
    plan: Plan,
    qkvo: [wgpu::Buffer; 4],
    lse: Option<wgpu::Buffer>,
    slopes: Option<wgpu::Buffer>,
    indices: [Option<wgpu::Buffer>; 4],
}

impl Attention for OnDevice {
    fn name(&self) -> &str {
        "wgpu-resident"
    }

    fn availability(&self) -> Availability {
        self.wgpu.availability()
    }

    fn numerics(&self, dtype: DType) -> Numerics {
        self.wgpu.numerics(dtype)
    }

    /// The backend's plan.
    fn plan(&self, problem: &Problem) -> Result<Plan> {
        self.wgpu.plan(problem)
    }

    fn prepare<'a>(&'a self, plan: &Plan, inputs: Inputs<'a>) -> Result<Box<dyn Prepared + 'a>> {
        let problem = plan.problem;
        problem.check_inputs(&inputs)?;
        let device = self.wgpu.device()?;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let upload = |label, bytes: &[u8]| {
            // Whole words: a 16-bit tensor of an odd length ends inside its last word.
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4).max(1) * 4, 0xff);
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &padded,
                usage,
            })
        };
        let o_len = problem.required_lens()[3].1;
        let qkvo = [
            upload("q", &le_bytes(inputs.q)),
            upload("k", &le_bytes(inputs.k)),
            upload("v", &le_bytes(inputs.v)),
            // NaN in every dtype: elements the call should write and does not stay NaN.
            upload("o", &vec![0xff; o_len * problem.dtype.size()]),
        ];
        let lse = problem.params.return_lse.then(|| upload("lse", &vec![0xff; 4 * problem.lse_len()]));
        let slopes = inputs.extras.alibi_slopes.map(|x| upload("alibi slopes", bytemuck::cast_slice(x)));
        let e = inputs.extras;
        let indices = [e.cu_seqlens_q, e.cu_seqlens_k, e.seqused_k, e.block_table]
            .map(|x| x.map(|x| upload("indices", bytemuck::cast_slice(x))));
        Ok(Box::new(OnDevicePrepared { harness: self, plan: plan.clone(), qkvo, lse, slopes, indices }))
    }
}

impl Prepared for OnDevicePrepared<'_> {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    /// One [`Wgpu::submit`], and the wait for it, on the host clock.
    fn run(&mut self) -> Result<Duration> {
        let wgpu = &self.harness.wgpu;
        let t = DeviceTensor::new;
        let [q, k, v, o] = &self.qkvo;
        let [cu_seqlens_q, cu_seqlens_k, seqused_k, block_table] =
            self.indices.each_ref().map(|x| x.as_ref().map(t));
        let sequences = DeviceSequences { cu_seqlens_q, cu_seqlens_k, seqused_k, block_table };
        let inputs = DeviceInputs {
            alibi_slopes: self.slopes.as_ref().map(t),
            sequences,
            ..DeviceInputs::new(t(q), t(k), t(v))
        };
        let outputs = DeviceOutputs { o: t(o), lse: self.lse.as_ref().map(t) };
        let start = Instant::now();
        wgpu.submit(&self.plan, inputs, outputs)?;
        wgpu.gpu()?.wait("running the device-resident call")?;
        Ok(start.elapsed())
    }

    fn read(&mut self, mut outputs: Outputs<'_>) -> Result<()> {
        let problem = self.plan.problem;
        problem.check_outputs(&outputs)?;
        let gpu = self.harness.wgpu.gpu()?;
        let bytes = read_buffer(&gpu, &self.qkvo[3])?;
        let o = from_le_bytes(problem.dtype, &bytes, problem.required_lens()[3].1);
        outputs.o.copy_view_from(o.as_data(), &problem)?;
        if let (Some(dst), Some(src)) = (outputs.lse.as_deref_mut(), &self.lse) {
            let bytes = read_buffer(&gpu, src)?;
            for (d, s) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        Ok(())
    }
}

/// The little-endian bytes of `data`'s elements.
fn le_bytes(data: Data<'_>) -> Vec<u8> {
    match data {
        Data::F32(x) => x.iter().flat_map(|e| e.to_le_bytes()).collect(),
        Data::F16(x) => x.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect(),
        Data::Bf16(x) => x.iter().flat_map(|e| e.to_bits().to_le_bytes()).collect(),
    }
}

/// The first `len` elements of `dtype` in little-endian `bytes`.
fn from_le_bytes(dtype: DType, bytes: &[u8], len: usize) -> Buffer {
    let words = |n: usize| bytes.chunks_exact(n).take(len);
    match dtype {
        DType::F32 => Buffer::F32(words(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()),
        DType::F16 => {
            Buffer::F16(words(2).map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]]))).collect())
        }
        DType::Bf16 => {
            Buffer::Bf16(words(2).map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))).collect())
        }
    }
}
