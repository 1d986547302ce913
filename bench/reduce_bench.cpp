// Throughput of nexar::reduce::accumulate (dst[i] = op(dst[i], src[i])).
//
// bytes_per_second counts the size of one buffer per call (the amount of data reduced, as
// in NCCL's "algorithm bandwidth"); memory traffic is three times that (read dst and src,
// write dst). 64 KiB buffers stay in L1/L2, 4 MiB ones mostly come from L3 / DRAM.
#include <benchmark/benchmark.h>

#include <nexar/dtype.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "reduce/reduce.hpp"

namespace {

using nexar::DataType;
using nexar::ReduceOp;

// Buffers of harmless values: no NaN/inf/subnormal slow paths, no overflow in the run.
std::vector<unsigned char> make_buffer(DataType t, std::size_t bytes, unsigned seed) {
  std::vector<unsigned char> buf(bytes);
  const std::size_t n = bytes / nexar::size_of(t);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>((i * 7 + seed) % 97) * 0.01f - 0.48f;
    unsigned char* p = buf.data() + i * nexar::size_of(t);
    switch (t) {
      case DataType::f32: std::memcpy(p, &v, 4); break;
      case DataType::f16: {
        const std::uint16_t h = nexar::to_half(v).bits;
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::bf16: {
        const std::uint16_t h = nexar::to_bfloat16(v).bits;
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::i32: {
        const auto x = static_cast<std::int32_t>((i * 2654435761u + seed) & 0xFFFFFFu) - (1 << 23);
        std::memcpy(p, &x, 4);
        break;
      }
      default: break;
    }
  }
  return buf;
}

void accumulate_bench(benchmark::State& state, DataType t, ReduceOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t n = bytes / nexar::size_of(t);
  std::vector<unsigned char> dst = make_buffer(t, bytes, 1);
  const std::vector<unsigned char> src = make_buffer(t, bytes, 2);
  for (auto _ : state) {
    nexar::reduce::accumulate(t, op, dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(n));
  state.SetLabel(nexar::reduce::simd_target());
}

void BM_accumulate_f32_sum(benchmark::State& s) { accumulate_bench(s, DataType::f32, ReduceOp::sum); }
void BM_accumulate_bf16_sum(benchmark::State& s) { accumulate_bench(s, DataType::bf16, ReduceOp::sum); }
void BM_accumulate_f16_sum(benchmark::State& s) { accumulate_bench(s, DataType::f16, ReduceOp::sum); }
void BM_accumulate_i32_max(benchmark::State& s) { accumulate_bench(s, DataType::i32, ReduceOp::max); }

constexpr std::int64_t k64KiB = 64 << 10;
constexpr std::int64_t k4MiB = 4 << 20;

BENCHMARK(BM_accumulate_f32_sum)->Arg(k64KiB)->Arg(k4MiB);
BENCHMARK(BM_accumulate_bf16_sum)->Arg(k64KiB)->Arg(k4MiB);
BENCHMARK(BM_accumulate_f16_sum)->Arg(k64KiB)->Arg(k4MiB);
BENCHMARK(BM_accumulate_i32_max)->Arg(k64KiB)->Arg(k4MiB);

}  // namespace

BENCHMARK_MAIN();
