//! Compiles one kernel specialisation with NVRTC (no GPU needed) and writes its CUBIN, so that
//! its SASS can be read with `cuobjdump -sass`. Prints ptxas's resource report (and, for the
//! Hopper family, ptxas's whole log: its notes on wgmma pipelines).
//!
//! ```text
//! cargo run -p attn-cuda --example cubin -- <f16|bf16> <head_dim> <warps> <m_tiles> <block_n> <stages> [causal|window] [softcap] [seqs] [alibi] [pad] [sm_80|sm_89|sm_90a] [source=<file>]
//! cargo run -p attn-cuda --example cubin -- sm90 <f16|bf16> <head_dim> [causal|window] [softcap] [alibi] [q2] [top] [trace] [pad] [seqs] [paged] [tiles=<keys>:<stages>:<consumers>]
//! ```
//!
//! With `source=<file>` among the arguments, the Ampere/Ada variant is compiled from that copy of
//! `kernels/flash_fwd.cu` instead of the one built in.

use attn_core::DType;
use attn_cuda::ampere::Variant;
use attn_cuda::{Arch, compile, hopper};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sm90") {
        return hopper_cubin(&args[1..]);
    }
    let usage = "usage: cubin <f16|bf16> <head_dim> <warps> <m_tiles> <block_n> <stages> [causal|window] [softcap] [seqs] [alibi] [pad] [sm_80|sm_89|sm_90a] [source=<file>]";
    if args.len() < 6 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let num = |i: usize| -> usize {
        args[i].parse().unwrap_or_else(|_| panic!("{usage}: {} is not a number", args[i]))
    };
    let variant = Variant {
        dtype: if args[0] == "bf16" { DType::Bf16 } else { DType::F16 },
        head_dim: num(1),
        warps: num(2) as u32,
        m_tiles: num(3) as u32,
        block_n: num(4),
        stages: num(5) as u32,
        causal: args.iter().any(|a| a == "causal"),
        window: args.iter().any(|a| a == "window"),
        softcap: args.iter().any(|a| a == "softcap"),
        seqs: args.iter().any(|a| a == "seqs"),
        alibi: args.iter().any(|a| a == "alibi"),
        pad: args.iter().any(|a| a == "pad"),
    };
    let arch = match args.iter().find(|a| a.starts_with("sm_")).map(String::as_str) {
        Some("sm_80") => Arch::Sm80,
        Some("sm_89") => Arch::Sm89,
        _ => Arch::Sm90a,
    };
    // source=<file>: compile another copy of the kernel source (to try an edit without
    // rebuilding this example), with the variant's defines.
    let request = match args.iter().find_map(|a| a.strip_prefix("source=")) {
        Some(path) => {
            let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
            attn_cuda::CompileRequest::new(variant.name(), source, arch)
                .headers(attn_cuda::ampere::HEADERS)
                .defines(variant.defines())
        }
        None => variant.request(arch),
    };
    match compile(&request) {
        Ok(c) => {
            let r = c.resources_of("attn_fwd").cloned().unwrap_or_default();
            let path = format!("{}_{}.cubin", variant.name(), arch.as_str());
            std::fs::write(&path, &c.cubin).expect("write the cubin");
            println!(
                "{path}: {} registers (budget {}), {} B spilled, {} B shared",
                r.registers,
                variant.register_budget(),
                r.spill_bytes(),
                variant.shared_bytes()
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

fn hopper_cubin(args: &[String]) {
    let usage = "usage: cubin sm90 <f16|bf16> <head_dim> [causal|window] [softcap] [alibi] [q2] [top] [trace] [pad] [seqs] [paged] [tiles=<keys>:<stages>:<consumers>]";
    let (Some(dtype), Some(d)) = (args.first(), args.get(1)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let head_dim: usize = d.parse().unwrap_or_else(|_| panic!("{usage}: {d} is not a number"));
    let forced = args.iter().find_map(|a| a.strip_prefix("tiles=")).map(|t| {
        let n: Vec<u32> =
            t.split(':').map(|x| x.parse().unwrap_or_else(|_| panic!("{usage}: {t}"))).collect();
        assert_eq!(n.len(), 3, "{usage}: {t}");
        hopper::Tiles { block_n: n[0] as usize, stages: n[1], consumers: n[2] }
    });
    let tiles = forced.unwrap_or_else(|| hopper::tiles(head_dim));
    let variant = hopper::Variant {
        dtype: if dtype == "bf16" { DType::Bf16 } else { DType::F16 },
        head_dim,
        block_n: tiles.block_n,
        stages: tiles.stages,
        consumers: tiles.consumers,
        causal: args.iter().any(|a| a == "causal"),
        window: args.iter().any(|a| a == "window"),
        softcap: args.iter().any(|a| a == "softcap"),
        alibi: args.iter().any(|a| a == "alibi"),
        q_slots: 1,
        bottom: !args.iter().any(|a| a == "top"),
        trace: args.iter().any(|a| a == "trace"),
        l2: hopper::L2Promotion::B256,
        pad: args.iter().any(|a| a == "pad"),
        seqs: args.iter().any(|a| a == "seqs" || a == "paged"),
        paged: args.iter().any(|a| a == "paged"),
    };
    let variant = match args.iter().any(|a| a == "q2") {
        true => variant.with_q_slots(2).unwrap_or_else(|e| panic!("{e}")),
        false => variant,
    };
    match compile(&variant.request()) {
        Ok(c) => {
            let path = format!("{}.cubin", variant.name());
            std::fs::write(&path, &c.cubin).expect("write the cubin");
            std::fs::write(format!("{}.ptx", variant.name()), &c.ptx).expect("write the ptx");
            println!("{path}\n{}", c.log.trim_end());
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
