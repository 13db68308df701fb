// Element conversions of the pack and unpack passes, on bits (u32 holding an f32, or the low 16
// bits an f16 or bf16), in integer arithmetic: exact where exact is possible, rounding to nearest
// even otherwise, as the host path (the `half` crate) rounds, and independent of how a driver
// converts floats or treats subnormals.

// f16 -> f32, exact (an f16 subnormal is an f32 normal); a NaN keeps its payload, made quiet.
fn f16_to_f32(h: u32) -> u32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0x1fu) {
        if (m == 0u) {
            return sign | 0x7f800000u;
        }
        return sign | 0x7fc00000u | (m << 13u);
    }
    if (e != 0u) {
        return sign | ((e + 112u) << 23u) | (m << 13u);
    }
    if (m == 0u) {
        return sign;
    }
    // m * 2^-24 with its top bit at p: exponent p - 24, the bits below p the fraction.
    let p = firstLeadingBit(m);
    return sign | ((p + 103u) << 23u) | ((m << (23u - p)) & 0x7fffffu);
}

// f32 -> f16, rounded to nearest even; past the largest f16 to infinity, below half the
// smallest subnormal to zero; a NaN stays a (quiet) NaN.
fn f32_to_f16(x: u32) -> u32 {
    let sign = (x >> 16u) & 0x8000u;
    let e = (x >> 23u) & 0xffu;
    let m = x & 0x7fffffu;
    if (e == 0xffu) {
        if (m == 0u) {
            return sign | 0x7c00u;
        }
        return sign | 0x7e00u | (m >> 13u);
    }
    let he = i32(e) - 112;
    if (he >= 31) {
        return sign | 0x7c00u;
    }
    if (he <= 0) {
        if (he < -10) {
            return sign;
        }
        // A subnormal f16: the significand with its leading one, shifted into place.
        let mm = m | 0x800000u;
        let shift = u32(14 - he);
        let half = 1u << (shift - 1u);
        var out = mm >> shift;
        // Up where above half way, or at half way with an odd result.
        if ((mm & half) != 0u && (mm & (3u * half - 1u)) != 0u) {
            out += 1u;
        }
        return sign | out;
    }
    var out = sign | (u32(he) << 10u) | (m >> 13u);
    // A carry out of the fraction moves into the exponent, as it should (to infinity at most).
    if ((m & 0x1000u) != 0u && (m & 0x2fffu) != 0u) {
        out += 1u;
    }
    return out;
}

// f32 -> bf16, rounded to nearest even; a NaN stays a (quiet) NaN.
fn f32_to_bf16(x: u32) -> u32 {
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (x >> 16u) | 0x40u;
    }
    var out = x >> 16u;
    if ((x & 0x8000u) != 0u && (x & 0x17fffu) != 0u) {
        out += 1u;
    }
    return out;
}
