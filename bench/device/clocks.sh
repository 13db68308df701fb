# Sourced by the device scripts: samples the GPU's SM clock, power draw, temperature and the
# reasons its clocks are held down every 100 ms while the timings run, so that a report can say at
# what clock each row ran (bench/device/clocks.py; rows carry t0/t1, Unix seconds, around their
# timed runs). The samples' timestamps are the machine's local time, as the rows' are.
# Usage: `source bench/device/clocks.sh; clocks_start "$out/clocks.csv"; ...; clocks_stop`.
clocks_pid=
clocks_start() {
  local fields=timestamp,clocks.sm,power.draw,temperature.gpu,power.limit
  # The reasons' field: clocks_event_reasons.active on recent drivers, clocks_throttle_reasons
  # before; without it if both are refused.
  local reasons
  for reasons in clocks_event_reasons.active clocks_throttle_reasons.active; do
    if nvidia-smi --query-gpu=$reasons --format=csv,noheader >/dev/null 2>&1; then
      fields=$fields,$reasons
      break
    fi
  done
  nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -lms 100 > "$1" 2>/dev/null &
  clocks_pid=$!
  trap clocks_stop EXIT  # not left sampling if the script ends early
}
clocks_stop() { [[ -n $clocks_pid ]] && kill "$clocks_pid" 2>/dev/null; clocks_pid=; }
