// cuDNN's legacy convolution API (still shipped in cuDNN 9, beside the graph API): descriptors
// and algorithms chosen once per geometry by cuDNN's heuristics, one workspace for the three
// passes, FMA math (no TF32) so results stay within the reference backend's tolerances. The
// bias is the rows the forward adds onto, its gradient column sums of dy ([rows, out_c] in NHWC).
#include "backends/cuda/cuda_conv2d.h"

#include <algorithm>
#include <array>

#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"

namespace tandem::cuda {
namespace {

std::size_t floats(int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); }

int narrow(int64_t v, const char* what) {
  if (v > INT32_MAX) fail("cuda", cat("conv2d: ", what, " ", v, " is past cuDNN's int range"));
  return static_cast<int>(v);
}

// The most a convolution's workspace may take (FFT algorithms can ask for gigabytes).
constexpr std::size_t kMaxWorkspaceBytes = std::size_t{256} << 20;

// The first algorithm in cuDNN's heuristic ranking that runs here deterministically (the same
// sums every run, as tandem's training tests require; the atomics of some backward
// algorithms are not), in FMA math (no TF32), within the workspace bound.
template <typename Perf>
Perf first_usable(const std::array<Perf, 8>& found, int count, const char* pass, const Conv2dGeometry& g) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = found[static_cast<std::size_t>(i)];
    if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC && p.mathType == CUDNN_FMA_MATH &&
        p.memory <= kMaxWorkspaceBytes)
      return p;
  }
  fail("cuda", cat("cuDNN has no deterministic f32 ", pass, " algorithm within ", kMaxWorkspaceBytes >> 20,
                   " MiB of workspace for conv2d ", g.str(), " (NHWC)"));
}

// cuDNN descriptors, destroyed with their owner (also when a constructor throws midway).
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
struct Descriptor {
  T d = nullptr;
  Descriptor() { check(Create(&d), "creating a cuDNN descriptor"); }
  ~Descriptor() { Destroy(d); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
};
using TensorDescriptor = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

class CudnnConv2d final : public Conv2dKernel {
 public:
  CudnnConv2d(std::shared_ptr<Context> ctx, const Conv2dGeometry& g)
      : ctx_(bound(std::move(ctx))), g_(g), rows_(g.batch * g.out_h() * g.out_w()),
        weights_(static_cast<std::size_t>(g.out_c * g.kernel_h * g.kernel_w * (g.in_c / g.groups)),
                 g.bias ? static_cast<std::size_t>(g.out_c) : 0),
        x_(floats(g.batch * g.in_h * g.in_w * g.in_c)), y_(floats(rows_ * g.out_c)),
        dw_(floats(g.out_c * g.kernel_h * g.kernel_w * (g.in_c / g.groups))), db_(floats(g.out_c)),
        ones_(g.bias ? device_ones(*ctx_, rows_) : DeviceBuffer()) {
    check(cudnnSetTensor4dDescriptor(x_desc_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, narrow(g.batch, "batch"),
                                     narrow(g.in_c, "in_c"), narrow(g.in_h, "in_h"), narrow(g.in_w, "in_w")),
          "conv2d input descriptor");
    check(cudnnSetTensor4dDescriptor(y_desc_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, narrow(g.batch, "batch"),
                                     narrow(g.out_c, "out_c"), narrow(g.out_h(), "out_h"), narrow(g.out_w(), "out_w")),
          "conv2d output descriptor");
    // OHWI is cuDNN's NHWC filter format (K, R, S, C): the weights as they are.
    check(cudnnSetFilter4dDescriptor(w_desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, narrow(g.out_c, "out_c"),
                                     narrow(g.in_c / g.groups, "in_c"), narrow(g.kernel_h, "kernel_h"),
                                     narrow(g.kernel_w, "kernel_w")),
          "conv2d filter descriptor");
    check(cudnnSetConvolution2dDescriptor(conv_, narrow(g.pad_h, "pad_h"), narrow(g.pad_w, "pad_w"),
                                          narrow(g.stride_h, "stride_h"), narrow(g.stride_w, "stride_w"),
                                          narrow(g.dilation_h, "dilation_h"), narrow(g.dilation_w, "dilation_w"),
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
          "conv2d descriptor");
    check(cudnnSetConvolutionGroupCount(conv_, narrow(g.groups, "groups")), "conv2d groups");
    check(cudnnSetConvolutionMathType(conv_, CUDNN_FMA_MATH), "conv2d math type");

    const cudnnHandle_t h = ctx_->dnn();
    int n = 0;
    std::array<cudnnConvolutionFwdAlgoPerf_t, 8> fwd{};
    check(cudnnGetConvolutionForwardAlgorithm_v7(h, x_desc_, w_desc_, conv_, y_desc_, 8, &n, fwd.data()),
          "choosing the conv2d forward algorithm");
    const auto f = first_usable(fwd, n, "forward", g);
    std::array<cudnnConvolutionBwdDataAlgoPerf_t, 8> bwd_data{};
    check(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_desc_, y_desc_, conv_, x_desc_, 8, &n, bwd_data.data()),
          "choosing the conv2d backward-data algorithm");
    const auto d = first_usable(bwd_data, n, "backward-data", g);
    std::array<cudnnConvolutionBwdFilterAlgoPerf_t, 8> bwd_filter{};
    check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_desc_, y_desc_, conv_, w_desc_, 8, &n,
                                                        bwd_filter.data()),
          "choosing the conv2d backward-filter algorithm");
    const auto w = first_usable(bwd_filter, n, "backward-filter", g);
    forward_algo_ = f.algo;
    data_algo_ = d.algo;
    filter_algo_ = w.algo;
    workspace_ = DeviceBuffer(std::max({f.memory, d.memory, w.memory}));
  }

  void forward(const float* x, const WeightsView& w, float* y) override {
    Call call(*ctx_);
    weights_.update(call, w);
    const float* d_x = call.in(x, x_);
    float* d_y = call.out(y, y_);
    if (weights_.bias()) check(bias_rows(weights_.bias(), d_y, rows_, g_.out_c, ctx_->stream()), "conv2d bias");
    const float one = 1.0f, beta = weights_.bias() ? 1.0f : 0.0f;
    check(cudnnConvolutionForward(ctx_->dnn(), &one, x_desc_, d_x, w_desc_, weights_.weight(), conv_, forward_algo_,
                                  workspace_.get(), workspace_.bytes(), &beta, y_desc_, d_y),
          "cudnnConvolutionForward");
    call.end();
  }

  void backward_data(const float* dy, const WeightsView& w, float* dx) override {
    Call call(*ctx_);
    weights_.update(call, w);
    const float* d_dy = call.in(dy, y_);
    const float one = 1.0f, zero = 0.0f;
    check(cudnnConvolutionBackwardData(ctx_->dnn(), &one, w_desc_, weights_.weight(), y_desc_, d_dy, conv_, data_algo_,
                                       workspace_.get(), workspace_.bytes(), &zero, x_desc_, call.out(dx, x_)),
          "cudnnConvolutionBackwardData");
    call.end();
  }

  void backward_weights(const float* x, const float* dy, float* dw, float* db) override {
    Call call(*ctx_);
    const float* d_x = call.in(x, x_);
    const float* d_dy = call.in(dy, y_);
    const float one = 1.0f, zero = 0.0f;
    check(cudnnConvolutionBackwardFilter(ctx_->dnn(), &one, x_desc_, d_x, y_desc_, d_dy, conv_, filter_algo_,
                                         workspace_.get(), workspace_.bytes(), &zero, w_desc_, call.out(dw, dw_)),
          "cudnnConvolutionBackwardFilter");
    if (db) ctx_->column_sums(d_dy, ones_.f(), call.out(db, db_), rows_, g_.out_c);
    call.end();
  }

 private:
  std::shared_ptr<Context> ctx_;
  Conv2dGeometry g_;
  int64_t rows_;
  DeviceWeights weights_;
  DeviceBuffer x_, y_, dw_, db_, ones_, workspace_;
  TensorDescriptor x_holder_, y_holder_;
  FilterDescriptor w_holder_;
  ConvolutionDescriptor conv_holder_;
  cudnnTensorDescriptor_t x_desc_ = x_holder_.d, y_desc_ = y_holder_.d;
  cudnnFilterDescriptor_t w_desc_ = w_holder_.d;
  cudnnConvolutionDescriptor_t conv_ = conv_holder_.d;
  cudnnConvolutionFwdAlgo_t forward_algo_{};
  cudnnConvolutionBwdDataAlgo_t data_algo_{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo_{};
};

}  // namespace

std::unique_ptr<Conv2dKernel> make_conv2d(std::shared_ptr<Context> ctx, const Conv2dGeometry& g) {
  return std::make_unique<CudnnConv2d>(std::move(ctx), g);
}

}  // namespace tandem::cuda
