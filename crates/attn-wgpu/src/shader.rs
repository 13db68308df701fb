//! The WGSL of any [`Variant`]: the FMA kernel's ([`crate::fma`]) or the cooperative-matrix
//! kernel's ([`crate::coop`]). Both generators build on the pieces of [`crate::wgsl`] and not on
//! each other.

use crate::plan::{Kernel, KernelType, Variant};

/// The WGSL source of `variant`, ready for `create_shader_module` (or, for the
/// cooperative-matrix kernel, for `spirv::compile_coop`).
pub(crate) fn generate(variant: &Variant) -> String {
    match variant.kernel {
        Kernel::Fma => crate::fma::generate(variant),
        Kernel::Coop => crate::coop::generate(variant),
    }
}

/// The WGSL of a key split's merge step (`kernels/merge.wgsl`) for outputs of type `ty`.
pub(crate) fn merge(ty: KernelType) -> String {
    let (enable, et) = match ty {
        KernelType::F32 => ("", "f32"),
        KernelType::F16 => ("enable f16;", "f16"),
    };
    crate::wgsl::fill(include_str!("../kernels/merge.wgsl"), &[("ENABLE", enable), ("ET", et)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{KernelType, candidates};

    /// Every specialisation the planner can pick parses and validates (naga, no adapter needed),
    /// and its workgroup memory is what `Variant::shared_bytes` says.
    #[test]
    fn every_variant_validates_and_matches_its_shared_bytes() {
        // One thread per head dim: a few thousand shaders go through naga.
        let counts: Vec<(usize, usize)> = std::thread::scope(|scope| {
            let dims: Vec<_> =
                (32..=256).step_by(32).map(|d| scope.spawn(move || check_head_dim(d))).collect();
            dims.into_iter().map(|t| t.join().expect("a head dim's check panicked")).collect()
        });
        let checked: usize = counts.iter().map(|c| c.0).sum();
        let checked_coop: usize = counts.iter().map(|c| c.1).sum();
        assert!(checked > 100, "{checked}");
        assert!(checked_coop >= 16, "{checked_coop}");
    }

    /// Every variant of head dim `d` (both dtypes and masks, every subgroup size): (checked,
    /// of which cooperative-matrix).
    fn check_head_dim(d: u32) -> (usize, usize) {
        // Each variant once: most are the same for several subgroup sizes.
        let mut seen = std::collections::HashSet::new();
        let mut variants = Vec::new();
        for ty in [KernelType::F32, KernelType::F16] {
            for causal in [false, true] {
                for subgroup_min in [None, Some(8), Some(32)] {
                    // The cooperative-matrix kernel: f16, subgroups of 32.
                    let coop = crate::plan::coop_candidates(d, causal)
                        .filter(|_| ty == KernelType::F16 && subgroup_min == Some(32));
                    // The 8x8 kernel's shapes (the same for every subgroup size).
                    let all = coop.chain(candidates(ty, d, causal, subgroup_min));
                    variants.extend(all.filter(|v| seen.insert(*v)));
                    // Each FMA shape with every score feature (a window in place of the causal
                    // mask): the code they add is the same piece for each feature whether the
                    // others are on or not.
                    let scored = candidates(ty, d, causal, subgroup_min).map(Variant::with_every_feature);
                    variants.extend(scored.filter(|v| seen.insert(*v)));
                }
            }
        }
        let (mut checked, mut checked_coop) = (0, 0);
        for v in variants {
            let src = generate(&v);
            assert!(!src.contains("{{"), "{}: unsubstituted placeholder", v.name());
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}: {}", v.name(), e.emit_to_string(&src)));
            // Only what the device is opened with (runtime.rs): not, for example, subgroup
            // barriers.
            use naga::valid::Capabilities as C;
            let caps = C::SUBGROUP
                | if v.ty == KernelType::F16 { C::SHADER_FLOAT16 } else { C::empty() }
                | if v.kernel == Kernel::Coop { C::COOPERATIVE_MATRIX } else { C::empty() };
            let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
            validator
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {}", v.name(), e.emit_to_string(&src)));
            let shared: u32 = module
                .global_variables
                .iter()
                .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
                .sum();
            assert_eq!(shared, v.shared_bytes(), "{}", v.name());
            let trips = loop_trips_per_tile(&src);
            assert!(trips <= v.loop_trips_per_tile(), "{}: {trips} loop trips per tile", v.name());
            checked += 1;
            checked_coop += usize::from(v.kernel == Kernel::Coop);
        }
        (checked, checked_coop)
    }

    /// The loop iterations one invocation runs per key tile in `src`, counted as Mesa's software
    /// adapters count them (`plan::SOFTWARE_LOOP_LIMIT`): every trip of every loop in the tile
    /// loop's body, nested loops multiplied out, loops of the functions it calls included, and
    /// the tile loop's own trip. Loop bounds are evaluated from the `const` declarations; the
    /// run-time values that bound a loop are taken at their largest (`stages_seen` at `NCH`,
    /// `half` and `lid` at 0, where they start a loop; the probe's two trips).
    fn loop_trips_per_tile(src: &str) -> u32 {
        let consts: Vec<(String, u32)> = src
            .lines()
            .filter_map(|l| l.strip_prefix("const ")?.split_once(": u32 = "))
            .fold(Vec::new(), |mut known, (name, expr)| {
                let value = eval(expr.split(';').next().unwrap_or(expr), &known);
                known.push((name.to_string(), value));
                known
            });
        let mut env = consts.clone();
        let nch = consts.iter().find(|(n, _)| n == "NCH").map_or(1, |c| c.1);
        env.extend([
            ("stages_seen".into(), nch),
            ("half".into(), 0),
            ("lid".into(), 0),
            ("P.probe_trips".into(), 2),
        ]);
        // Functions other than main, with their own loops' trips.
        let mut functions = Vec::new();
        for (at, _) in src.match_indices("\nfn ") {
            let name = &src[at + 4..at + 4 + src[at + 4..].find('(').unwrap()];
            let open = at + src[at..].find('{').unwrap();
            let body = &src[open + 1..closing(src, open)];
            if name != "main" {
                let trips = trips_in(body, &env, &functions);
                functions.push((name.to_string(), trips));
            }
        }
        let tile = src.find("for (var t = ").expect("the tile loop");
        let open = tile + src[tile..].find('{').unwrap();
        1 + trips_in(&src[open + 1..closing(src, open)], &env, &functions)
    }

    /// Trips of the loops in `code` (and of the functions it calls outside them), nested loops
    /// multiplied out.
    fn trips_in(code: &str, env: &[(String, u32)], functions: &[(String, u32)]) -> u32 {
        let mut total = 0;
        let mut rest = code;
        while let Some(at) = rest.find("for (var ") {
            total += calls(&rest[..at], functions);
            let open = at + rest[at..].find(") {").unwrap() + 2;
            let header = &rest[at + 9..open - 2];
            let end = closing(rest, open);
            // `i = A; i < B; i++` or `i += S`
            let parts: Vec<&str> = header.splitn(3, "; ").collect();
            let start = eval(parts[0].split_once(" = ").unwrap().1, env);
            let bound = eval(parts[1].split_once(" < ").unwrap().1, env);
            let step = parts[2].split_once(" += ").map_or(1, |(_, s)| eval(s, env));
            let trips = bound.saturating_sub(start).div_ceil(step);
            total += trips * (1 + trips_in(&rest[open + 1..end], env, functions));
            rest = &rest[end + 1..];
        }
        total + calls(rest, functions)
    }

    /// Trips of the loops in the functions `code` calls.
    fn calls(code: &str, functions: &[(String, u32)]) -> u32 {
        functions
            .iter()
            .map(|(name, trips)| {
                let called = code
                    .match_indices(&format!("{name}("))
                    .filter(|(i, _)| !code[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
                    .count();
                called as u32 * trips
            })
            .sum()
    }

    /// The index of the brace that closes the one at `open`.
    fn closing(s: &str, open: usize) -> usize {
        let mut depth = 0;
        for (i, c) in s[open..].char_indices() {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            if depth == 0 {
                return open + i;
            }
        }
        panic!("no closing brace")
    }

    /// A constant expression of `u32` literals, known names, `+ - * /` and parentheses.
    fn eval(expr: &str, env: &[(String, u32)]) -> u32 {
        fn sum(t: &mut std::iter::Peekable<std::vec::IntoIter<String>>, env: &[(String, u32)]) -> u32 {
            let mut v = product(t, env);
            while let Some(op) = t.next_if(|x| x == "+" || x == "-") {
                let r = product(t, env);
                v = if op == "+" { v + r } else { v - r };
            }
            v
        }
        fn product(t: &mut std::iter::Peekable<std::vec::IntoIter<String>>, env: &[(String, u32)]) -> u32 {
            let mut v = atom(t, env);
            while let Some(op) = t.next_if(|x| x == "*" || x == "/") {
                let r = atom(t, env);
                v = if op == "*" { v * r } else { v / r };
            }
            v
        }
        fn atom(t: &mut std::iter::Peekable<std::vec::IntoIter<String>>, env: &[(String, u32)]) -> u32 {
            let x = t.next().expect("an operand");
            if x == "(" {
                let v = sum(t, env);
                assert_eq!(t.next().as_deref(), Some(")"));
                return v;
            }
            if let Ok(n) = x.trim_end_matches('u').parse() {
                return n;
            }
            env.iter().find(|(n, _)| *n == x).unwrap_or_else(|| panic!("unknown `{x}`")).1
        }
        let spaced = expr.replace('(', " ( ").replace(')', " ) ");
        let tokens: Vec<String> = spaced.split_whitespace().map(String::from).collect();
        sum(&mut tokens.into_iter().peekable(), env)
    }
}
