// tests/cpp/torch_peers_test.cpp: the torch-op peers of the benches (torch/peers.cpp) against the
// core's double references, forward and gradients (through torch's autograd), on small awkward
// sizes: batch 2, head_dim != head_dim_v, sequences that pad (Monarch) or split into blocks of
// 1..3 tokens (MLR), every step count the benches use and more.
//   mlr_blockwise_attention  vs strata::reference::mlr_attention_{forward,backward}_blockwise
//   monarch_attention        vs strata::reference::monarch_attention_{forward,backward}
// Both sides compute the same formula in double (float64 inputs), so they agree to rounding; the
// float32 cases check the peer in the dtype the benches run it in.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "strata/error.h"
#include "strata/mlr.h"
#include "strata/monarch.h"
#include "strata/torch/attention.h"  // view_of
#include "strata/torch/peers.h"
#include "test_util.h"
#include "test_util.h"

namespace {

namespace peers = strata::torch::peers;
using strata::Layout;
using strata::detail::cat;
using strata::test::rel_err;

// Tolerances, normwise (test_util.h's rel_err, floor 1e-6):
// float64: both sides form the same sums in double, in different orders; each output sums at most
// T * (D + Dv) = 24 * 14 products of O(1) values and the softmaxes add a few roundings per entry,
// so they differ by at most ~ 3e2 * 1.1e-16 = 3e-14 relative (measured: 7.4e-16). 1e-13 leaves
// room for that bound and still catches any wrong term (a missing level, block, scale or step
// changes the outputs by > 1e-3).
constexpr double kF64Tol = 1e-13;
// float32: the peer's ATen float32 arithmetic against double: eps 6e-8 times the same short sums
// and up to 3 alternating steps, each feeding the next: ~ 1e-6 (measured: 3.1e-7); 1e-5 leaves 10x.
constexpr double kF32Tol = 1e-5;

// Random BHSD tensor b x h x s x d of `dtype` (values in [-1, 1) from a seeded generator).
at::Tensor rand_bhsd(int64_t b, int64_t h, int64_t s, int64_t d, at::ScalarType dtype) {
  return (at::rand({b, h, s, d}, at::TensorOptions().dtype(at::kDouble)) * 2 - 1).to(dtype);
}

// A BHSD tensor's values in the BSHD order the references write, as doubles.
std::vector<double> bshd_values(const at::Tensor& bhsd) {
  const at::Tensor t = bhsd.detach().transpose(1, 2).contiguous().to(at::kDouble);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

strata::TensorView tv(const at::Tensor& t, const char* arg) { return strata::torch::view_of(t, "peers test", arg); }

// The peer's output and its autograd gradients for dout: {o, dq, dk, dv}, BSHD order.
template <class Peer>
std::vector<std::vector<double>> run_peer(const Peer& peer, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& dout) {
  const at::Tensor qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
                   vg = v.detach().requires_grad_(true);
  const at::Tensor o = peer(qg, kg, vg);
  const auto g = torch::autograd::grad({o}, {qg, kg, vg}, {dout});
  return {bshd_values(o), bshd_values(g[0]), bshd_values(g[1]), bshd_values(g[2])};
}

// Expects each of the peer's {o, dq, dk, dv} within tol of the reference's.
void expect_near(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want, double tol,
                 const std::string& name) {
  const char* what[4] = {"o", "dq", "dk", "dv"};
  for (size_t i = 0; i < 4; ++i) EXPECT_LE(rel_err(got[i], want[i]), tol) << name << ": " << what[i];
}

struct MlrCase {
  int64_t b, h, t, dv;
  std::vector<int64_t> ranks;
  bool causal;
};

TEST(TorchPeers, MlrBlockwiseMatchesTheBlockwiseReference) {
  // L = 4 with T = 8 has blocks of 8, 4, 2, 1 tokens; T = 12, L = 3: 12, 6, 3; L = 1 is dense
  // attention at scale 1/r_1 over an odd T.
  const MlrCase cases[] = {{2, 3, 12, 5, {3, 2, 1}, true},  {2, 3, 12, 5, {3, 2, 1}, false},
                           {1, 2, 8, 4, {2, 2, 1, 3}, true}, {2, 1, 7, 3, {5}, true},
                           {1, 2, 24, 6, {4, 4}, false},      {1, 1, 1, 2, {3}, true}};
  at::manual_seed(1);
  for (const MlrCase& c : cases)
    for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
      int64_t D = 0;
      for (int64_t r : c.ranks) D += r;
      const at::Tensor q = rand_bhsd(c.b, c.h, c.t, D, dtype), k = rand_bhsd(c.b, c.h, c.t, D, dtype),
                       v = rand_bhsd(c.b, c.h, c.t, c.dv, dtype), dout = rand_bhsd(c.b, c.h, c.t, c.dv, dtype);
      strata::MlrOptions opt;
      for (int64_t r : c.ranks) opt.ranks[opt.num_levels++] = r;
      opt.causal = c.causal;
      opt.layout = Layout::BHSD;
      std::vector<std::vector<double>> want(4);
      std::vector<double> lse(size_t(c.b * c.h * c.t));
      want[0].resize(size_t(c.b * c.t * c.h * c.dv));
      want[1].resize(size_t(c.b * c.t * c.h * D));
      want[2].resize(want[1].size());
      want[3].resize(want[0].size());
      strata::reference::mlr_attention_forward_blockwise(tv(q, "q"), tv(k, "k"), tv(v, "v"), opt, want[0].data(),
                                                         lse.data());
      strata::reference::mlr_attention_backward_blockwise(tv(q, "q"), tv(k, "k"), tv(v, "v"), tv(dout, "dout"), opt,
                                                          want[1].data(), want[2].data(), want[3].data());
      const auto peer = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
        return peers::mlr_blockwise_attention(qq, kk, vv, c.ranks, c.causal);
      };
      expect_near(run_peer(peer, q, k, v, dout), want, dtype == at::kDouble ? kF64Tol : kF32Tol,
                  cat("mlr b", c.b, " h", c.h, " T", c.t, " L", c.ranks.size(), " dv", c.dv,
                      c.causal ? " causal " : " ", c10::toString(dtype)));
    }
}

struct MonCase {
  int64_t b, h, n, d, dv, block;
};

TEST(TorchPeers, MonarchMatchesTheReference) {
  // N = 7, B = 3 and N = 10, B = 0 (floor(sqrt(10)) = 3) pad the last block; N = 16, B = 4 does
  // not; B = 1 and B > N (one block) are exact softmax attention.
  const MonCase cases[] = {{2, 2, 7, 5, 3, 3}, {1, 3, 10, 4, 6, 0}, {2, 1, 16, 8, 8, 4},
                           {1, 2, 5, 3, 2, 1}, {1, 1, 6, 4, 4, 9}};
  at::manual_seed(2);
  for (const MonCase& c : cases)
    for (const int64_t steps : {1, 2, 3})
      for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
        const at::Tensor q = rand_bhsd(c.b, c.h, c.n, c.d, dtype), k = rand_bhsd(c.b, c.h, c.n, c.d, dtype),
                         v = rand_bhsd(c.b, c.h, c.n, c.dv, dtype), dout = rand_bhsd(c.b, c.h, c.n, c.dv, dtype);
        strata::MonarchOptions opt;
        opt.num_steps = steps;
        opt.block_size = c.block;
        opt.layout = Layout::BHSD;
        std::vector<std::vector<double>> want(4);
        want[0].resize(size_t(c.b * c.n * c.h * c.dv));
        want[1].resize(size_t(c.b * c.n * c.h * c.d));
        want[2].resize(want[1].size());
        want[3].resize(want[0].size());
        strata::reference::monarch_attention_forward(tv(q, "q"), tv(k, "k"), tv(v, "v"), opt, want[0].data());
        strata::reference::monarch_attention_backward(tv(q, "q"), tv(k, "k"), tv(v, "v"), tv(dout, "dout"), opt,
                                                      want[1].data(), want[2].data(), want[3].data());
        const auto peer = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
          return peers::monarch_attention(qq, kk, vv, steps, c.block);
        };
        expect_near(run_peer(peer, q, k, v, dout), want, dtype == at::kDouble ? kF64Tol : kF32Tol,
                    cat("monarch b", c.b, " h", c.h, " N", c.n, " D", c.d, " Dv", c.dv, " B", c.block, " T", steps,
                        " ", c10::toString(dtype)));
      }
}

// (expect_error: tests/cpp/test_util.h)
using strata::test::expect_error;

TEST(TorchPeers, BadArgumentsNameTheArgument) {
  const at::Tensor q = at::randn({1, 2, 8, 6}), v = at::randn({1, 2, 8, 4});
  expect_error([&] { peers::mlr_blockwise_attention(q, q, v, {3, 2}); }, {"mlr_blockwise_attention", "'ranks'", "6"});
  expect_error([&] { peers::mlr_blockwise_attention(q, q, v, {}); }, {"'ranks'", "1..16 levels"});
  expect_error([&] { peers::mlr_blockwise_attention(q, q, v, {3, 3, 0}); }, {"'ranks'", ">= 1"});
  const at::Tensor q6 = at::randn({1, 2, 6, 6}), v6 = at::randn({1, 2, 6, 4});
  expect_error([&] { peers::mlr_blockwise_attention(q6, q6, v6, {2, 2, 2}); }, {"'q'", "multiple of 2^(L-1) = 4"});
  const at::Tensor k1 = at::randn({1, 1, 8, 6}), v1 = at::randn({1, 1, 8, 4});
  expect_error([&] { peers::mlr_blockwise_attention(q, k1, v1, {6}); }, {"'k'", "no GQA"});
  expect_error([&] { peers::monarch_attention(q, k1, v1, 1); }, {"peers::monarch_attention", "'k'"});
  expect_error([&] { peers::monarch_attention(q, q, v, 0); }, {"'num_steps'", ">= 1"});
  expect_error([&] { peers::monarch_attention(q, q, v, 1, -1); }, {"'block_size'"});
  expect_error([&] { peers::monarch_attention(q.to(at::kInt), q, v, 1); }, {"'q'"});
  expect_error([&] { peers::monarch_attention(q, q, v.narrow(2, 0, 4), 1); }, {"'v'"});
}

}  // namespace
