"""The GPU's state while a row ran: reads the samples bench/device/clocks.sh writes (timestamp, SM
clock in MHz, power draw and limit in W, temperature, and where the driver reports them the
reasons the clocks are held down, a bit mask) and gives the medians of those inside a row's t0..t1
(Unix seconds around its timed runs)."""
import statistics, time

# nvidia-smi's clocks_event_reasons bits, by name.
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
           0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def load(path):
    """The samples as (unix seconds, sm MHz, power W, temperature C, power limit W, reasons)."""
    samples = []
    try:
        for line in open(path):
            f = [x.strip() for x in line.split(",")]
            try:
                stamp, frac = f[0].split(".") if "." in f[0] else (f[0], "0")
                t = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
                reasons = int(f[5], 16) if len(f) > 5 and f[5].startswith("0x") else None
                samples.append((t, float(f[1]), float(f[2]), float(f[3]), float(f[4]), reasons))
            except (ValueError, IndexError):
                continue  # a line cut by the sampler's stop, or a field the driver left "[N/A]"
    except FileNotFoundError:
        pass
    return samples


def during(samples, t0, t1):
    """Median SM clock, power and temperature of the samples in t0..t1, the reasons seen (named),
    and their count; None where no sample fell inside."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return None
    reasons = [s[5] for s in inside if s[5] is not None]
    state = {"sm_mhz": statistics.median(s[1] for s in inside),
             "power_w": round(statistics.median(s[2] for s in inside), 1),
             "power_limit_w": inside[0][4],
             "temp_c": statistics.median(s[3] for s in inside), "samples": len(inside)}
    if reasons:
        mask = 0
        for r in reasons:
            mask |= r
        state["clock_reasons"] = "+".join(n for bit, n in REASONS.items() if mask & bit) or "none"
    return state
