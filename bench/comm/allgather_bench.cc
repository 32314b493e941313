// The uneven all-gather two ways on a real Gloo group on loopback, side by
// side in one run: the point-to-point exchange the Gloo backend uses (every
// rank sends its rows to every other rank at once) and Gloo's own ring
// all-gather (rows padded to the widest band). Payloads are the two the
// decoders gather: GroupNorm statistics (one small row per rank) and the
// K/V of a mid-block attention (rows of a latent's tokens, uneven bands).
//
//   bazel run -c opt //bench/comm:allgather_bench -- [--rounds 5] [--iterations 20]
//
// Prints a Markdown table: median microseconds per all-gather over the
// rounds, ratio native / point-to-point (above 1: point-to-point is faster).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "parallel/band_partition.h"
#include "parallel/gloo_communicator.h"
#include "parallel/store.h"
#include "parallel/testing/multi_process.h"
#include "rpc/status_macros.h"

namespace {

using vaedecode::parallel::CallKind;
using vaedecode::parallel::GlooAllGather;

struct Payload {
  std::string name;
  int64_t rows;          // gathered rows in all (uneven over the ranks), or one per rank
  int64_t row_elements;  // float32 elements per row
  bool one_row_per_rank;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Rank 0 writes one line per round: the two algorithms' mean microseconds.
absl::Status Measure(int world, const Payload& payload, int rounds, int iterations, const std::string& out_path) {
  return vaedecode::parallel::testing::RunRanks(
      world,
      [&](int rank, int w, int port) -> absl::Status {
        // One store (hosted by rank 0) for both groups.
        vaedecode::parallel::TcpStoreOptions store_options;
        store_options.port = port;
        store_options.is_master = rank == 0;
        ASSIGN_OR_RETURN(auto store, vaedecode::parallel::ConnectTcpStore(store_options));
        std::vector<std::unique_ptr<vaedecode::parallel::Communicator>> comms;
        for (GlooAllGather algorithm : {GlooAllGather::kPointToPoint, GlooAllGather::kNative}) {
          vaedecode::parallel::GlooOptions options;
          options.rank = rank;
          options.world_size = w;
          options.store = store;
          options.group_name = algorithm == GlooAllGather::kNative ? "native" : "p2p";
          options.timeout = absl::Seconds(60);
          options.all_gather = algorithm;
          ASSIGN_OR_RETURN(auto comm, vaedecode::parallel::GlooCommunicator::Create(options));
          comms.push_back(std::move(comm));
        }
        std::vector<int64_t> sizes(w, 1);
        if (!payload.one_row_per_rank) {
          sizes = vaedecode::parallel::ShardSpec::ForRows(0, payload.rows, rank, w).sizes();
        }
        const at::Tensor local = at::randn({sizes[rank], payload.row_elements});
        std::ofstream out;
        if (rank == 0) out.open(out_path);
        for (int round = 0; round < rounds; ++round) {
          std::vector<double> us;
          for (auto& comm : comms) {
            RETURN_IF_ERROR(comm->Barrier());
            const absl::Time start = absl::Now();
            for (int i = 0; i < iterations; ++i) {
              ASSIGN_OR_RETURN(auto all, comm->AllGather(local, sizes, CallKind::kAttentionKV));
            }
            us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start) / iterations);
          }
          if (rank == 0) out << us[0] << " " << us[1] << "\n";
        }
        return absl::OkStatus();
      },
      absl::Minutes(10));
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, iterations = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    int* target = flag == "--rounds" ? &rounds : flag == "--iterations" ? &iterations : nullptr;
    if (target == nullptr || !absl::SimpleAtoi(argv[i + 1], target) || *target < 1) {
      std::fprintf(stderr, "usage: allgather_bench [--rounds N] [--iterations N]\n");
      return 2;
    }
  }
  const std::vector<Payload> payloads = {
      // SD's GroupNorm: 2·B·G + 1 doubles per rank (B=1, G=32), as float pairs.
      {"group norm statistics (1 row of 130 floats per rank)", 0, 130, true},
      // SD mid-block attention at a 64x64 latent: 4096 tokens x (K,V) x 512 channels.
      {"mid-block K/V, 64x64 latent (16 MiB in all, 64 uneven rows)", 64, 64 * 2 * 512, false},
      {"mid-block K/V, 32x32 latent (4 MiB in all, 32 uneven rows)", 32, 32 * 2 * 512, false},
      // Between the two: where the crossover lies.
      {"64 KiB in all (16 uneven rows of 1024 floats)", 16, 1024, false},
  };
  const char* tmp = std::getenv("TMPDIR");
  const std::string out_path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/allgather_bench.txt");
  std::printf("Gloo on loopback, float32, %d rounds of %d all-gathers per algorithm, medians; %d CPUs\n\n", rounds,
              iterations, static_cast<int>(std::thread::hardware_concurrency()));
  std::printf("| payload | ranks | point-to-point us | Gloo native us | native / point-to-point |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const Payload& payload : payloads) {
    for (int world : {2, 3, 4}) {
      if (absl::Status s = Measure(world, payload, rounds, iterations, out_path); !s.ok()) {
        std::fprintf(stderr, "%s at %d ranks: %s\n", payload.name.c_str(), world, s.ToString().c_str());
        return 1;
      }
      std::ifstream in(out_path);
      std::vector<double> p2p, native;
      double a = 0, b = 0;
      while (in >> a >> b) {
        p2p.push_back(a);
        native.push_back(b);
      }
      const double mp = Median(p2p), mn = Median(native);
      std::printf("| %s | %d | %.0f | %.0f | %.2f |\n", payload.name.c_str(), world, mp, mn, mn / mp);
      std::fflush(stdout);
    }
  }
  return 0;
}
