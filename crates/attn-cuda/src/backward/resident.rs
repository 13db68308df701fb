//! The backward pass on tensors already on the device, on the caller's stream (what the candle
//! op's backward runs): no copy, no synchronization; the workspace (D, the f32 dQ accumulator)
//! is allocated on the stream per call and freed there after the launches.

use super::launch::{BackwardPointers, KernelParams};
use super::run::{ChosenBackward, LaunchParams, Workspace, enqueue, functions};
use crate::backend::Cuda;
use crate::device::{DeviceElement, check_aligned, check_contexts, check_dtype, check_len};
use crate::indices::{self, DeviceArrays};
use attn_core::{BackwardOptions, Error, Plan, Problem, Result};
use cudarc::driver::{CudaContext, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice};
use std::sync::Arc;

/// One backward call's tensors on the device: q, k, v, the forward's output and its LSE (f32,
/// the problem's LSE layout), dO (with o's strides), and the gradients written (each with its
/// input's strides). Every element is where the problem's strides put it from the view's start.
pub struct DeviceGrads<'a, T> {
    /// Queries.
    pub q: CudaView<'a, T>,
    /// Keys.
    pub k: CudaView<'a, T>,
    /// Values.
    pub v: CudaView<'a, T>,
    /// The forward's output.
    pub o: CudaView<'a, T>,
    /// The forward's log-sum-exp.
    pub lse: CudaView<'a, f32>,
    /// The loss's gradient of the output.
    pub d_o: CudaView<'a, T>,
    /// Written: the gradient of q.
    pub dq: CudaViewMut<'a, T>,
    /// Written: the gradient of k.
    pub dk: CudaViewMut<'a, T>,
    /// Written: the gradient of v.
    pub dv: CudaViewMut<'a, T>,
}

impl Cuda {
    /// Plans the backward of `problem` for the device of `ctx` (a caller's context), as
    /// [`Cuda::plan_on`] plans the forward: compiled (host work, cached), nothing allocated.
    pub fn plan_backward_on(
        &self,
        ctx: &Arc<CudaContext>,
        problem: &Problem,
        options: BackwardOptions,
    ) -> Result<Plan> {
        super::run::plan(&*self.context_for(ctx)?, problem, options, &self.options)
    }

    /// Enqueues the backward pass of `plan` (from [`Cuda::plan_backward_on`]) on `stream`: reads
    /// q, k, v, o, the LSE and dO of `t`, writes its dq, dk and dv. `arrays` holds the index
    /// arrays and ALiBi slopes the problem needs (its `lse` must be `None`: the LSE is `t.lse`).
    /// Asynchronous; errors before anything is enqueued as [`Cuda::run_on_stream`]'s do.
    pub fn backward_on_stream<T: DeviceElement>(
        &self,
        plan: &Plan,
        mut t: DeviceGrads<'_, T>,
        arrays: DeviceArrays<'_>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let chosen = ChosenBackward::of(plan)?;
        let problem = &plan.problem;
        check_dtype::<T>(plan)?;
        if arrays.lse.is_some() {
            return Err(Error::Shape {
                tensor: "lse",
                what: "the backward's LSE is DeviceGrads::lse, not an array".into(),
            });
        }
        check_contexts(
            [
                ("q", t.q.stream()),
                ("k", t.k.stream()),
                ("v", t.v.stream()),
                ("o", t.o.stream()),
                ("lse", t.lse.stream()),
                ("d_o", t.d_o.stream()),
                ("dq", t.dq.stream()),
                ("dk", t.dk.stream()),
                ("dv", t.dv.stream()),
            ],
            stream,
        )?;
        let [q_len, k_len, v_len, o_len] = problem.required_lens().map(|(_, n)| n);
        for (tensor, len, need) in [
            ("q", t.q.len(), q_len),
            ("k", t.k.len(), k_len),
            ("v", t.v.len(), v_len),
            ("o", t.o.len(), o_len),
            ("d_o", t.d_o.len(), o_len),
            ("dq", t.dq.len(), q_len),
            ("dk", t.dk.len(), k_len),
            ("dv", t.dv.len(), v_len),
            ("lse", t.lse.len(), problem.lse_len()),
        ] {
            check_len(tensor, len, need)?;
        }
        let (given, _index_guards) = arrays.given(stream);
        let extras = indices::check(problem, given, stream.context().ordinal())?;
        let gpu = self.context_for(stream.context())?;
        let functions = functions(&gpu, chosen)?;
        let mut workspace = Workspace::new(stream, problem, chosen)?;
        // The addresses, with cudarc's stream-ordering guards held until the launches are enqueued.
        let (q, _q) = t.q.device_ptr(stream);
        let (k, _k) = t.k.device_ptr(stream);
        let (v, _v) = t.v.device_ptr(stream);
        let (o, _o) = t.o.device_ptr(stream);
        let (lse, _lse) = t.lse.device_ptr(stream);
        let (d_o, _d_o) = t.d_o.device_ptr(stream);
        let (dq, _dq) = t.dq.device_ptr_mut(stream);
        let (dk, _dk) = t.dk.device_ptr_mut(stream);
        let (dv, _dv) = t.dv.device_ptr_mut(stream);
        for (tensor, address) in
            [("q", q), ("k", k), ("v", v), ("o", o), ("d_o", d_o), ("dq", dq), ("dk", dk), ("dv", dv)]
        {
            check_aligned(tensor, address)?;
        }
        let at = BackwardPointers { q, k, v, o, d_o, lse, dq, dk, dv, ..Default::default() };
        let trace = workspace.trace_address(stream);
        let params = LaunchParams::new(
            KernelParams::new(
                workspace.add_to(at, stream),
                extras,
                problem,
                chosen.deterministic,
                chosen.dq_copies,
                chosen.rotate_key_blocks,
            ),
            problem,
            chosen,
            trace,
        )?;
        // SAFETY: every buffer was checked above to hold the problem's elements on the stream's
        // context; the views borrow the caller's buffers for this call and the workspace is
        // freed on the stream after the launches (stream-ordered).
        unsafe { enqueue(&functions, chosen, &params, stream) }
    }
}
