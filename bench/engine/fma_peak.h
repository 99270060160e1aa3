// The machine's fp32 FMA peak, measured: every thread runs a loop of independent fused multiply-adds
// on the widest vectors the build targets (AVX-512, else AVX2 + FMA, else scalar), with enough
// accumulators to keep both FMA pipes busy. The figure the fast-convolution headline is divided by.
#pragma once

namespace cosmoflow {

// GFLOP/s (one FMA = 2 flops) of `threads` OpenMP threads, best of a few short runs.
double MeasureFmaPeakGflops(int threads);

}  // namespace cosmoflow
