#!/usr/bin/env bash
# On the lent GPU machine (an H100 or H200), in one call: the Hopper family of the cuda backend
# (kernels/flash_fwd_sm90.cu), next to PyTorch SDPA's cuDNN and FlashAttention-2 backends on the
# same shapes, and the Ampere/Ada family for reference.
# Steps (STEPS, default all but sweep):
#   smoke     one small call per head dim and mask (and again on 3 CTAs), each under a timeout
#             (a hang is a deadlock), with its error against f64
#   verify    attn verify: the full grid, then again with grids of 2, 3 and 7 CTAs
#             (VERIFY_GRIDS), each computing many tiles, and with 3 and 7 the split tail's runs
#             across tiles
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck on small cases
#   sass      cuobjdump of the CUBINs: HGMMA present, no local-memory traffic
#   bench     the bf16 GEMM ceiling; the kernel, the Ampere family and the peers on bf16,
#             D=64/128, S=2048..16384 (the rows the issue's targets name)
#   sweep     other tiles (SWEEP="d:keys:stages[:consumers] ...", 0 or unsaid: the head dim's),
#             S=4096 and 16384 (SWEEP_SEQS), both masks (SWEEP_MASKS), SWEEP_ROUNDS times, with
#             the SM clock and power logged (clocks.csv); each configuration also with the binary
#             BASE names (another commit's attn, labelled -base), and with the split tail on and
#             off (SWEEP_SPLIT="on off", labelled split-on/-off), in turn with this one;
#             VERIFY_TILES="keys:stages[:consumers] ..." runs the quick grid with those first
#   profile   Nsight Compute on one launch (PROFILE="d seq mask", default "128 4096 none"): warp
#             states and stall samples per SASS instruction
#   grid      the standard grid (bf16 and f16, D=64/128/256, S=512..16384) and the peers: the
#             table for docs/performance.md
# Expects `cargo xtask bundle` output in .device/ (carry it). Writes $OUT/hopper.tgz and
# $OUT/hopper-table.md. timeout_s=600; each step under its own timeout.
set -uo pipefail
final=${OUT:-/tmp/out}; out=$final/hopper; mkdir -p "$out"
pack() { echo "step $1 done at ${SECONDS}s" >> "$out/steps.txt"; tar -czf "$final/hopper.tgz" -C "$final" hopper; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper  # the Ampere rows below ask for theirs
attn=.device/bin/attn
steps=${STEPS:-smoke verify sanitize sass bench grid}
has() { [[ " $steps " == *" $1 "* ]]; }
TARGETS=(--dtypes bf16 --dims 64,128 --seqs 2048,4096,8192,16384 --masks none,causal --tokens 16384 --model-dim 2048)
STANDARD=(--dtypes bf16,f16 --dims 64,128,256 --seqs 512,1024,2048,4096,8192,16384 --masks none,causal
          --tokens 16384 --model-dim 2048)
# attn bench rows of one configuration, labelled (impl) so that report.py keeps them apart.
bench() {  # label, then attn bench arguments
  local label=$1; shift
  timeout 200 $attn bench --backend cuda --warmup 5 --iters 30 --check-rows 8 "$@" 2> "$out/attn-$label.log" \
    | python3 -c "import json,sys
for l in sys.stdin:
    r = json.loads(l); r['impl'] = '$label'; print(json.dumps(r))" > "$out/attn-$label.jsonl"
  echo "$label: $(wc -l < "$out/attn-$label.jsonl") rows; $(tail -1 "$out/attn-$label.log")"
}
# attn verify on cuda under the given knob settings; prints its exit status and verdict.
verify() {  # label, then env settings, then attn verify arguments after --
  local label=$1; shift; local settings=()
  while [[ $1 != -- ]]; do settings+=("$1"); shift; done; shift
  env "${settings[@]}" timeout 150 $attn verify --backend cuda --json "$@" > "$out/verify-$label.json" 2> "$out/verify-$label.log"
  echo "verify exit $?"; python3 -c "import json; print(json.load(open('$out/verify-$label.json'))['verdict'])" 2>/dev/null \
    || tail -5 "$out/verify-$label.log"
}
meta() {  # suite, command
  cat <<META
{"suite": "$1", "device": "$(nvidia-smi --query-gpu=name --format=csv,noheader)", "commit": "$(cat .device/COMMIT)",
 "date": "$(date -u +%FT%TZ)", "command": "$2",
 "clock": "CUDA events around each call, each behind an untimed twin of itself (lead: repeat); medians of 30 after 5 warm-up calls and 200 ms",
 "torch": "$(python3 -c 'import torch; print(torch.__version__, torch.backends.cudnn.version())')"}
META
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,enforced.power.limit,power.max_limit --format=csv; $attn backends; } 2>&1 | tee "$out/gpu.txt"
for d in 64 128 256; do
  $attn plan --backend cuda -d $d --seq 4096 --batch 4 --heads $((2048 / d)) 2>&1
done > "$out/plan.txt"

if has smoke; then
  echo "== smoke: one small call per head dim and mask (rel L2 against f64; 20 s each)"
  # Also with a grid of 3 CTAs: the smoke problems have fewer tiles than the H100 has SMs, and
  # only a CTA that computes several goes from one tile to the next.
  for g in "" 3; do
  for d in 64 128 256; do for c in "" --no-causal; do
    r=$(env ${g:+ATTN_CUDA_SM90_GRID=$g} timeout 20 $attn run --backend cuda -d $d --seq 300 --heads 4 --kv-heads 2 --batch 2 $c \
        --iters 1 --warmup 0 --check-rows 64 --json 2> "$out/smoke.err")
    code=$?
    if ((code == 124)); then  # a hang hangs every launch after it: stop, and keep the device time
      echo "${g:+grid $g }d$d ${c:-causal}: exit 124 (hang): stopping"; pack smoke; rm -rf "$out"; exit 1
    fi
    echo "${g:+grid $g }d$d ${c:-causal}: exit $code $(echo "$r" | python3 -c 'import json,sys
try:
    r = json.loads(sys.stdin.read()); a = r["accuracy"]
    wrong = " WRONG: bf16 lands near 2e-3" if not a["rel_l2"] <= 1e-2 or a["non_finite"] else ""
    print("rel_l2 %.2e max_abs %.2e %s%s" % (a["rel_l2"], a["max_abs"], r["plan"]["kernel"], wrong))
except Exception: print("no result")') $( ((code != 0)) && tail -2 "$out/smoke.err" | tr '\n' ' ')"
  done; done; done | tee "$out/smoke.txt"
  # attn run exits 0 whatever its error: a wrong result must not scroll by unread (5b3d17c's did).
  echo "smoke: $(grep -c 'WRONG\|no result\|exit [1-9]' "$out/smoke.txt") of $(wc -l < "$out/smoke.txt") calls failed"
fi
pack smoke
if has verify; then
  echo "== verify"
  verify sm90 ATTN_CUDA_FAMILY=hopper --
  # The grid's problems have fewer tiles than the H100 has SMs, so each CTA computes one (or a
  # run of the split tail); with a few CTAs each computes many (the piece slot, the barriers'
  # phases and the O buffer reused), and with 3 or 7 the tail's runs also cross from one tile
  # into the next, after whole tiles.
  for g in ${VERIFY_GRIDS:-2 3 7}; do
    echo "== verify (a persistent grid of $g CTAs)"
    verify grid$g ATTN_CUDA_SM90_GRID=$g --
  done
fi
pack verify
if has sanitize; then
  echo "== compute-sanitizer on small cases"
  for d in 64 128; do for c in "" --no-causal; do for tool in memcheck racecheck synccheck; do
    log="$out/sanitizer-$tool-d$d${c:+-nomask}.txt"
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $attn run --backend cuda --dtype bf16 \
        -d $d --seq 200 --heads 2 --batch 1 $c --iters 1 --warmup 0 --check-rows 4 --json > "$log" 2>&1
    echo "$tool d$d ${c:-causal}: exit $? $(grep -o '[A-Z]* SUMMARY: .*' "$log" | tail -1)"
  done; done; done | tee "$out/sanitizer.txt"
  # One CTA computing all four tiles of a case: the Q buffers and the tile slots reused.
  log="$out/sanitizer-racecheck-grid1.txt"
  ATTN_CUDA_SM90_GRID=1 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $attn run \
    --backend cuda --dtype bf16 -d 128 --seq 200 --heads 2 --batch 1 --no-causal --iters 1 --warmup 0 --check-rows 4 \
    --json > "$log" 2>&1
  echo "racecheck d128 --no-causal, one CTA: exit $? $(grep -o '[A-Z]* SUMMARY: .*' "$log" | tail -1)" \
    | tee -a "$out/sanitizer.txt"
  # The split tail: 8 tiles of 8 key tiles, dealt to 16 CTAs in runs of 4, each tile merged
  # from two pieces (global partial results, a counter, a flag in shared memory).
  for tool in memcheck racecheck synccheck; do
    log="$out/sanitizer-$tool-split.txt"
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $attn run --backend cuda \
      --dtype bf16 -d 128 --seq 1024 --heads 1 --batch 1 --no-causal --iters 1 --warmup 0 --check-rows 16 --json > "$log" 2>&1
    echo "$tool d128 S=1024 --no-causal, split tail: exit $? $(grep -o '[A-Z]* SUMMARY: .*' "$log" | tail -1)"
  done | tee -a "$out/sanitizer.txt"
fi
pack sanitize
if has sass; then
  echo "== SASS: HGMMA instructions, local-memory loads and stores"
  cubin=$PWD/.device/bin/cubin
  mkdir -p /tmp/sass && (cd /tmp/sass && for d in 64 128 256; do for c in "" causal; do
    $cubin sm90 bf16 $d $c > /dev/null || echo "cubin sm90 bf16 $d $c failed"
  done; done)
  for f in /tmp/sass/*.cubin; do
    cuobjdump -sass "$f" > "${f%.cubin}.sass" 2>&1
    echo "$(basename "$f"): HGMMA $(grep -c HGMMA "${f%.cubin}.sass"), LDL $(grep -c 'LDL' "${f%.cubin}.sass"), STL $(grep -c 'STL' "${f%.cubin}.sass")"
  done | tee "$out/sass.txt"
  cp /tmp/sass/*d128*.sass "$out/" 2>/dev/null
fi
pack sass
if has bench || has grid; then
  python3 - <<'PY' | tee "$out/gemm.txt"
import torch
a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(10): a @ b
times = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); a @ b; e.record(); e.synchronize(); times.append(s.elapsed_time(e))
times.sort()
print(f"bf16 GEMM 8192^3: {2 * 8192**3 / (times[10] * 1e-3) / 1e12:.0f} TFLOP/s (median of 20)")
PY
fi
gemm=$(grep -o '[0-9]* TFLOP/s' "$out/gemm.txt" 2>/dev/null | grep -o '^[0-9]*')
# Every row of a results file with ratios to cuDNN and FlashAttention-2 and the GEMM share.
targets() {  # results.json, our impl label
  python3 - "$1" "$2" "${gemm:-0}" <<'PY'
import json, sys
rows, ours, gemm = json.load(open(sys.argv[1]))["rows"], sys.argv[2], float(sys.argv[3])
by = {}
for r in rows:
    by.setdefault((r["dtype"], r["head_dim"], r["seq"], r["causal"]), {})[r["impl"]] = r["gflops"] / 1e3
for (dt, d, s, c), t in sorted(by.items()):
    line = f"{dt} D={d:<3} S={s:<5} {'causal' if c else 'none  '}"
    for impl in sorted(t):
        line += f" {impl} {t[impl]:6.1f}"
    o, cudnn, fa2 = t.get(ours), t.get("sdpa-cudnn"), t.get("sdpa-flash")
    if o and cudnn: line += f"  vs cuDNN {o / cudnn:.2f}x{'' if o >= cudnn else ' MISS' if d in (64, 128) and s >= 2048 else ''}"
    if o and fa2: line += f"  vs FA2 {o / fa2:.2f}x"
    if o and gemm: line += f"  {o / gemm:.0%} of GEMM"
    if o and d == 128 and s >= 4096 and not c: line += f"  [>=650: {'ok' if o >= 650 else 'MISS'}]"
    print(line)
PY
}
if has bench; then
  echo "== bench: the kernel, the Ampere family, the peers (bf16, D=64/128, S>=2048)"
  bench sm90 "${TARGETS[@]}"
  ATTN_CUDA_FAMILY=ampere bench ampere "${TARGETS[@]}"
  timeout 150 python3 bench/peers/torch_sdpa_gpu.py --backends cudnn,flash "${TARGETS[@]}" > "$out/sdpa-targets.jsonl" 2> "$out/sdpa-targets.log"
  echo "sdpa exit $?"
  meta hopper-targets "STEPS=bench bash bench/device/hopper.sh" > "$out/meta-targets.json"
  ours=(); for f in "$out/attn-sm90.jsonl" "$out/attn-ampere.jsonl"; do [[ -s $f ]] && ours+=(--ours "$f"); done
  python3 bench/report.py --unit TFLOP/s "${ours[@]}" --peer "$out/sdpa-targets.jsonl" --meta "$out/meta-targets.json" \
    --out "$out/targets-results.json" > "$out/targets-table.md"
  targets "$out/targets-results.json" sm90 | tee "$out/bench-targets.txt"
fi
pack bench
if has sweep; then
  for t in ${VERIFY_TILES:-}; do
    echo "== verify (tiles $t, quick grid)"
    verify "tiles-${t//:/-}" ATTN_CUDA_SM90_TILES=$t -- --quick
  done
  echo "== sweep: other tiles (d:keys:stages[:consumers]), ${SWEEP_ROUNDS:-1} round(s)"
  # The SM clock, power and throttle reasons every 200 ms while the sweep runs (rounds interleave
  # the configurations, so that a drift in clocks shows as a drift, not as a difference).
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv \
    -lms 200 > "$out/clocks.csv" 2>&1 & smi=$!
  for round in $(seq 1 ${SWEEP_ROUNDS:-1}); do
    for t in ${SWEEP:-64:192:2 64:128:3 128:176:2 128:128:3 128:112:2}; do IFS=: read -r d n st cons <<< "$t"
      for bin in $attn ${BASE:-}; do  # BASE: another commit's attn, timed in turn with this one
        for sp in ${SWEEP_SPLIT:-""}; do
          label="sweep-d$d-n$n-s$st-c${cons:-0}"
          [[ -n $sp ]] && label+="-split-$sp"
          [[ $bin != "$attn" ]] && label+="-base"
          ((${SWEEP_ROUNDS:-1} > 1)) && label+="-r$round"
          attn=$bin ATTN_CUDA_SM90_SPLIT=${sp:-on} ATTN_CUDA_SM90_TILES=$n:$st:${cons:-0} bench "$label" \
            --dtypes bf16 --dims $d --seqs ${SWEEP_SEQS:-4096,16384} --masks ${SWEEP_MASKS:-none,causal} --tokens 16384 \
            --model-dim 2048
        done
      done
    done
  done
  kill $smi 2>/dev/null
  python3 - "$out/clocks.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))[1:]
mhz = sorted(float(r[1].split()[0]) for r in rows if len(r) > 2 and r[1].strip()[:1].isdigit())
watts = sorted(float(r[2].split()[0]) for r in rows if len(r) > 2 and r[2].strip()[:1].isdigit())
if mhz:
    print(f"SM clock over the sweep: min {mhz[0]:.0f}, median {mhz[len(mhz) // 2]:.0f}, max {mhz[-1]:.0f} MHz; "
          f"power median {watts[len(watts) // 2]:.0f} W, max {watts[-1]:.0f} W ({len(mhz)} samples)")
PY
fi
pack sweep
if has profile; then
  read -r d seq mask <<< "${PROFILE:-128 4096 none}"
  echo "== profile: ncu on one launch, D=$d S=$seq $mask"
  c=; [[ $mask == none ]] && c=--no-causal
  timeout 240 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --section LaunchStats --section Occupancy -k regex:attn_fwd_sm90 --launch-skip 2 \
    --launch-count 1 -o "$out/profile" $attn run --backend cuda -d $d --seq $seq --batch $((16384 / seq)) \
    --heads $((2048 / d)) $c --iters 3 --warmup 0 --check-rows 8 > "$out/profile.log" 2>&1
  echo "ncu exit $?"; tail -3 "$out/profile.log"
  ncu -i "$out/profile.ncu-rep" --page details > "$out/profile-details.txt" 2>&1
  ncu -i "$out/profile.ncu-rep" --page source --csv --print-source sass > "$out/profile-source.csv" 2>&1
  grep -iE "duration|warp cycles per issued|issue slots busy|stall" "$out/profile-details.txt" | head -20
  wc -l "$out/profile-source.csv"
  # The same shape under attn bench, every launch's duration by ncu (one metric, no replay, no
  # cache flush) beside the CUDA-event median that bench reports: do the two clocks agree?
  timeout 200 ncu --clock-control none --cache-control none --metrics \
    gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second -k regex:attn_fwd_sm90 --csv $attn bench --backend cuda \
    --dtypes bf16 --dims $d --seqs $seq --masks $mask --tokens 16384 --model-dim 2048 --warmup 5 \
    --iters 30 > "$out/profile-bench.csv" 2> "$out/profile-bench.log"
  echo "ncu over attn bench exit $?"
  python3 - "$out/profile-bench.csv" <<'PY'
import csv, json, sys
lines = open(sys.argv[1]).read().splitlines()
bench = [json.loads(l) for l in lines if l.startswith("{")]
rows = list(csv.DictReader(l for l in lines if l.startswith('"')))
dur = sorted(float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"] == "gpu__time_duration.sum")
clk = sorted(float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"] == "sm__cycles_elapsed.avg.per_second")
unit = next((r["Metric Unit"] for r in rows if r["Metric Name"] == "gpu__time_duration.sum"), "?")
if dur:
    print(f"ncu: {len(dur)} launches, duration min {dur[0]:.1f} median {dur[len(dur) // 2]:.1f} max {dur[-1]:.1f} {unit}; "
          f"SM clock median {clk[len(clk) // 2]:.3g} (last 30: median {sorted(dur[-30:])[15]:.1f} {unit})")
for b in bench:
    print(f"attn bench under ncu: median {b['median_ms']:.3f} ms, {b['gflops'] / 1e3:.1f} TFLOP/s")
PY
fi
pack profile
if has grid; then
  echo "== grid: the kernel and the peers on the standard grid"
  bench sm90 "${STANDARD[@]}"
  timeout 240 python3 bench/peers/torch_sdpa_gpu.py --backends cudnn,flash "${STANDARD[@]}" > "$out/sdpa.jsonl" 2> "$out/sdpa.log"
  echo "sdpa exit $?"
  meta hopper "STEPS=grid bash bench/device/hopper.sh" > "$out/meta.json"
  python3 bench/report.py --unit TFLOP/s --ours "$out/attn-sm90.jsonl" --peer "$out/sdpa.jsonl" --meta "$out/meta.json" \
    --out "$out/hopper-results.json" > "$out/hopper-table.md"
  cp "$out/hopper-table.md" "$final/hopper-table.md"
  targets "$out/hopper-results.json" sm90 | tee "$out/targets.txt"
fi
pack grid
rm -rf "$out"  # everything is in hopper.tgz; only 8 files come back
