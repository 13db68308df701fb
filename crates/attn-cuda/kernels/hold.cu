// Holds a stream for a while, so that the host can queue a timed launch and the events around
// it before the device reaches them (Gpu::time in crates/attn-cuda/src/runtime.rs): the start
// event is then stamped when this kernel ends, not when the host's launch call begins, and the
// time between the events is the device's alone.

// One thread waits until `ns` nanoseconds of the global timer have passed since it started.
extern "C" __global__ void hold_stream(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
