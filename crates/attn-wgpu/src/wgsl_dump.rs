//! Not a check: writes every candidate variant's WGSL (and which variants the planner picks by
//! default on a grid of adapter classes) to `$WGSL_DUMP_DIR`, so that a refactor of the
//! generators can be shown to leave every shipped kernel's text unchanged
//! (`WGSL_DUMP_DIR=/tmp/x cargo test -p attn-wgpu wgsl_dump -- --ignored`, then `sha256sum`).

use crate::plan::{AdapterCaps, KernelType, Variant, candidates, choose, coop_candidates};
use attn_core::{DType, DeviceKind, Problem, Shape};
use std::collections::BTreeSet;

fn every_variant() -> Vec<Variant> {
    let mut seen = std::collections::HashSet::new();
    let mut all = Vec::new();
    for d in (32..=256).step_by(32) {
        for ty in [KernelType::F32, KernelType::F16] {
            for causal in [false, true] {
                for subgroup_min in [None, Some(4), Some(8), Some(16), Some(32), Some(64)] {
                    let coop = coop_candidates(d, causal).filter(|_| ty == KernelType::F16);
                    let list = coop.chain(candidates(ty, d, causal, subgroup_min));
                    all.extend(list.filter(|v| seen.insert(*v)));
                    // With a window (the measured shapes of `causal` too), a soft-cap and ALiBi.
                    let scored = candidates(ty, d, causal, subgroup_min).map(Variant::with_every_feature);
                    all.extend(scored.filter(|v| seen.insert(*v)));
                }
            }
        }
    }
    all
}

#[test]
#[ignore]
fn wgsl_dump() {
    let Ok(dir) = std::env::var("WGSL_DUMP_DIR") else { return };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(dir.join("wgsl")).unwrap();
    let mut names = BTreeSet::new();
    for v in every_variant() {
        assert!(names.insert(v.name()), "{} twice", v.name());
        std::fs::write(dir.join("wgsl").join(format!("{}.wgsl", v.name())), crate::shader::generate(&v))
            .unwrap();
    }
    // Default picks over adapter classes.
    let mut picked = BTreeSet::new();
    for kib in [16, 32, 48, 64, 100, 228] {
        for invocations in [128, 256, 1024] {
            for subgroup_min in [None, Some(4), Some(8), Some(16), Some(32), Some(64)] {
                for f16 in [false, true] {
                    for coop_f16 in [false, true] {
                        if coop_f16 && !(f16 && subgroup_min == Some(32)) {
                            continue;
                        }
                        let caps = AdapterCaps {
                            name: "grid".into(),
                            kind: DeviceKind::Gpu,
                            workgroup_storage: kib * 1024,
                            invocations,
                            workgroups_per_dim: 65535,
                            storage_binding: 1 << 40,
                            f16,
                            subgroup_min,
                            timestamps: true,
                            coop_f16,
                            loop_limit: None,
                        };
                        for d in [16, 32, 40, 64, 96, 128, 160, 192, 224, 256] {
                            for dtype in [DType::F32, DType::F16, DType::Bf16] {
                                for causal in [false, true] {
                                    for seq in [1, 300, 1024, 1025, 4096] {
                                        let mut p = Problem::new(Shape::new(1, 2, seq, d), dtype);
                                        if causal {
                                            p = p.causal();
                                        }
                                        if let Ok(c) = choose(&p, &caps) {
                                            picked.insert(c.variant.name());
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    std::fs::write(dir.join("default-picks.txt"), picked.into_iter().collect::<Vec<_>>().join("\n") + "\n")
        .unwrap();
}
