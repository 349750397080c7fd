// BatchNormGeluBf16 and BatchNormGeluGradBf16: a training batch norm (statistics of the batch, channels last) followed
// by the exact GELU, x Phi(x), in one pass over bfloat16 memory each way, and its gradient:
//   forward:  u = (x - mean) / sqrt(variance + epsilon) * scale + offset,  y = u Phi(u)
//   backward: g = dy (Phi(u) + u phi(u)), rounded to bfloat16 as the separate GELU's gradient is,
//             dx = scale / sqrt(variance + epsilon) (g - mean(g) - xhat mean(g xhat)),
//             d offset = sum(g), d scale = sum(g xhat)
// The separate ops read and write the batch norm's output once more each way, and the gradient of each between
// them: 13 passes over the activations a step where these take 9. The arithmetic is float32; the statistics are
// summed in float32 over runs of pixels and in double across them, in fixed parts of the pixels, added in a fixed
// order (so the result is the same on every call). erf is the rational approximation Eigen and XLA use
// (|error| < 5e-7).
// Built by components/common/compiled_kernels.py (make install); used by components/common/model.py.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

constexpr int64_t kRunPixels = 256;  // pixels summed in float32 before their sums are added in double

// The arithmetic is compiled for AVX512-BF16; the rest, TensorFlow's headers included, as TensorFlow itself is.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")

// The lanes of a block of 16 channels starting at c: all, or those left at the end.
inline __mmask16 Lanes(int64_t c, int64_t channels) {
  const int64_t left = channels - c;
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}


// float32 to bfloat16, to nearest (ties to even), as tf.cast.
inline __m256i ToBf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
inline __m512 FromBf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
// Masked only at a tail of channels: a masked store of 16-bit values is many times slower on some CPUs (AMD's).
inline void StoreBits(uint16_t* values, __mmask16 lanes, __m256i bits) {
  if (lanes == 0xFFFF) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values), bits);
  } else {
    _mm256_mask_storeu_epi16(values, lanes, bits);
  }
}
inline void StoreBf16(uint16_t* values, __mmask16 lanes, __m512 x) { StoreBits(values, lanes, ToBf16(x)); }
inline __m512 LoadBf16(const uint16_t* values, __mmask16 lanes) {
  return FromBf16(lanes == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values))
                                  : _mm256_maskz_loadu_epi16(lanes, values));
}

inline __m512 Erf(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-4.0f)), _mm512_set1_ps(4.0f));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_fmadd_ps(x2, _mm512_set1_ps(-2.72614225801306e-10f), _mm512_set1_ps(2.77068142495902e-08f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-2.10102402082508e-06f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-5.69250639462346e-05f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-7.34990630326855e-04f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-2.95459980854025e-03f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-1.60960333262415e-02f));
  p = _mm512_mul_ps(x, p);
  __m512 q = _mm512_fmadd_ps(x2, _mm512_set1_ps(-1.45660718464996e-05f), _mm512_set1_ps(-2.13374055278905e-04f));
  q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(-1.68282697438203e-03f));
  q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(-7.37332916720468e-03f));
  q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(-1.42647390514189e-02f));
  // p / q by the reciprocal's estimate and one Newton step (relative error < 1e-7): a division stalls the pipeline.
  __m512 reciprocal = _mm512_rcp14_ps(q);
  reciprocal = _mm512_mul_ps(reciprocal, _mm512_fnmadd_ps(q, reciprocal, _mm512_set1_ps(2.0f)));
  return _mm512_mul_ps(p, reciprocal);
}

// exp(x) for x <= 0 (Cephes' polynomial on x - n ln 2, times 2^n).
inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(1.9875691500e-4f), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

inline __m512 NormalCdf(__m512 u) {
  const __m512 half = _mm512_set1_ps(0.5f);
  return _mm512_fmadd_ps(half, Erf(_mm512_mul_ps(u, _mm512_set1_ps(0.70710678118654752f))), half);
}

inline __m512 Gelu(__m512 u) { return _mm512_mul_ps(u, NormalCdf(u)); }

// d/du u Phi(u) = Phi(u) + u phi(u)
inline __m512 GeluDerivative(__m512 u) {
  const __m512 density = _mm512_mul_ps(ExpNonPositive(_mm512_mul_ps(_mm512_set1_ps(-0.5f), _mm512_mul_ps(u, u))),
                                       _mm512_set1_ps(0.39894228040143268f));
  return _mm512_fmadd_ps(u, density, NormalCdf(u));
}

// Two per channel sums over pixels [first, last), added to first_sums and second_sums (double): add_pixel(pixel,
// first, second) adds a pixel's values into float32 sums of a run of kRunPixels, which are then added in double.
// The pixels are read in order (the channels of one pixel, then the next's), a run's sums in L1.
template <typename AddPixel>
void SumInRuns(int64_t channels, int64_t first, int64_t last, double* first_sums, double* second_sums,
               AddPixel add_pixel) {
  const int64_t padded = (channels + 15) / 16 * 16;
  std::vector<float> run_first(padded), run_second(padded);
  for (int64_t start = first; start < last; start += kRunPixels) {
    std::fill(run_first.begin(), run_first.end(), 0.0f);
    std::fill(run_second.begin(), run_second.end(), 0.0f);
    for (int64_t pixel = start; pixel < std::min(last, start + kRunPixels); ++pixel) {
      add_pixel(pixel, run_first.data(), run_second.data());
    }
    for (int64_t c = 0; c < channels; ++c) {
      first_sums[c] += run_first[c];
      second_sums[c] += run_second[c];
    }
  }
}

inline void Accumulate(float* sums, __m512 values) {
  _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_loadu_ps(sums), values));
}
inline void AccumulateProduct(float* sums, __m512 first, __m512 second) {
  _mm512_storeu_ps(sums, _mm512_fmadd_ps(first, second, _mm512_loadu_ps(sums)));
}

// Per channel sums over pixels [first, last) of x and x^2, in double, added to.
void SumMoments(const uint16_t* x, int64_t channels, int64_t first, int64_t last, double* first_sums,
                double* second_sums) {
  SumInRuns(channels, first, last, first_sums, second_sums, [&](int64_t pixel, float* sums, float* squares) {
    for (int64_t c = 0; c < channels; c += 16) {
      const __m512 value = LoadBf16(x + pixel * channels + c, Lanes(c, channels));
      Accumulate(sums + c, value);
      AccumulateProduct(squares + c, value, value);
    }
  });
}

// y = gelu(x a + b) over pixels [first, last), a and b per channel.
void NormalizeActivate(const uint16_t* x, const float* a, const float* b, int64_t channels, int64_t first,
                       int64_t last, uint16_t* y) {
  for (int64_t pixel = first; pixel < last; ++pixel) {
    for (int64_t c = 0; c < channels; c += 16) {
      const __mmask16 lanes = Lanes(c, channels);
      const __m512 u = _mm512_fmadd_ps(LoadBf16(x + pixel * channels + c, lanes), _mm512_maskz_loadu_ps(lanes, a + c),
                                       _mm512_maskz_loadu_ps(lanes, b + c));
      StoreBf16(y + pixel * channels + c, lanes, Gelu(u));
    }
  }
}

// The GELU's gradient g = dy gelu'(x a + b), rounded to bfloat16 and stored, over pixels [first, last), and its per
// channel sums of g and g xhat (xhat = (x - mean) rstd), in double, added to.
void ActivationGradient(const uint16_t* x, const uint16_t* dy, const float* a, const float* b, const float* mean,
                        const float* rstd, int64_t channels, int64_t first, int64_t last, uint16_t* g,
                        double* g_sums, double* g_xhat_sums) {
  SumInRuns(channels, first, last, g_sums, g_xhat_sums, [&](int64_t pixel, float* sums, float* xhat_sums) {
    for (int64_t c = 0; c < channels; c += 16) {
      const __mmask16 lanes = Lanes(c, channels);
      const __m512 value = LoadBf16(x + pixel * channels + c, lanes);
      const __m512 u =
          _mm512_fmadd_ps(value, _mm512_maskz_loadu_ps(lanes, a + c), _mm512_maskz_loadu_ps(lanes, b + c));
      const __m512 gradient = _mm512_mul_ps(LoadBf16(dy + pixel * channels + c, lanes), GeluDerivative(u));
      const __m256i bits = ToBf16(gradient);
      StoreBits(g + pixel * channels + c, lanes, bits);
      const __m512 rounded = FromBf16(bits);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(value, _mm512_maskz_loadu_ps(lanes, mean + c)),
                                        _mm512_maskz_loadu_ps(lanes, rstd + c));
      Accumulate(sums + c, rounded);
      AccumulateProduct(xhat_sums + c, rounded, xhat);
    }
  });
}

// dx = a (g - mean_g - xhat mean_g_xhat), in place over g, pixels [first, last).
void InputGradient(const uint16_t* x, const float* a, const float* mean, const float* rstd, const float* mean_g,
                   const float* mean_g_xhat, int64_t channels, int64_t first, int64_t last, uint16_t* g) {
  for (int64_t pixel = first; pixel < last; ++pixel) {
    for (int64_t c = 0; c < channels; c += 16) {
      const __mmask16 lanes = Lanes(c, channels);
      const __m512 xhat = _mm512_mul_ps(
          _mm512_sub_ps(LoadBf16(x + pixel * channels + c, lanes), _mm512_maskz_loadu_ps(lanes, mean + c)),
          _mm512_maskz_loadu_ps(lanes, rstd + c));
      uint16_t* values = g + pixel * channels + c;
      const __m512 centered = _mm512_sub_ps(LoadBf16(values, lanes), _mm512_maskz_loadu_ps(lanes, mean_g + c));
      const __m512 dx = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, a + c),
                                      _mm512_fnmadd_ps(xhat, _mm512_maskz_loadu_ps(lanes, mean_g_xhat + c), centered));
      StoreBf16(values, lanes, dx);
    }
  }
}

#pragma GCC pop_options

bool CpuSupported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

// The pool's threads take the `parts` parts of [0, pixels) as they come free; each part is fixed, and its sums are
// added in the order of the parts, so the result is the same on every call.
template <typename Work>
void InParts(OpKernelContext* context, int64_t pixels, int64_t parts, Work work) {
  auto* workers = context->device()->tensorflow_cpu_worker_threads()->workers;
  workers->ParallelFor(parts, /*cost_per_unit=*/int64_t{1} << 40, [&](int64_t first_part, int64_t last_part) {
    for (int64_t part = first_part; part < last_part; ++part) {
      work(part, pixels * part / parts, pixels * (part + 1) / parts);
    }
  });
}

// Several parts a thread, so that a thread held up (a core shared with other work) holds up the call less: the
// backward pass at 1536x15x15x64 took 7.6-8.3 ms against 9.0-12.2 with one part a thread (2 cores, 2026-11-28).
constexpr int64_t kPartsPerThread = 8;

int64_t Parts(OpKernelContext* context, int64_t pixels) {
  const int64_t threads = context->device()->tensorflow_cpu_worker_threads()->workers->NumThreads();
  return std::max<int64_t>(1, std::min<int64_t>(kPartsPerThread * threads, pixels / kRunPixels));
}

const uint16_t* Bits(const Tensor& tensor) {
  return reinterpret_cast<const uint16_t*>(tensor.flat<Eigen::bfloat16>().data());
}
uint16_t* Bits(Tensor* tensor) { return reinterpret_cast<uint16_t*>(tensor->flat<Eigen::bfloat16>().data()); }

struct Normalization {
  std::vector<float> mean, rstd, a, b;  // a = scale rstd, b = offset - mean a
};

Normalization Coefficients(const float* mean, const float* variance, const float* scale, const float* offset,
                           int64_t channels, float epsilon) {
  Normalization n{std::vector<float>(mean, mean + channels), std::vector<float>(channels), std::vector<float>(channels),
                  std::vector<float>(channels)};
  for (int64_t c = 0; c < channels; ++c) {
    n.rstd[c] = 1.0f / std::sqrt(variance[c] + epsilon);
    n.a[c] = scale[c] * n.rstd[c];
    n.b[c] = offset[c] - mean[c] * n.a[c];
  }
  return n;
}

// The sum over the parts of channel c, added in a fixed order.
double PartsSum(const std::vector<std::vector<double>>& sums, int64_t c) {
  double total = 0;
  for (const auto& part : sums) total += part[c];
  return total;
}

// Both ops: the epsilon attribute, and a CPU that runs them.
class BatchNormGeluKernel : public OpKernel {
 public:
  BatchNormGeluKernel(OpKernelConstruction* context, const char* name) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES(context, CpuSupported(),
                tensorflow::errors::Unimplemented(name, " needs a CPU with AVX512-BF16"));
  }

 protected:
  float epsilon_ = 1e-3f;
};

class BatchNormGeluBf16 : public BatchNormGeluKernel {
 public:
  explicit BatchNormGeluBf16(OpKernelConstruction* context) : BatchNormGeluKernel(context, "BatchNormGeluBf16") {}

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& scale = context->input(1);
    const Tensor& offset = context->input(2);
    OP_REQUIRES(context, x.dims() >= 2, tensorflow::errors::InvalidArgument("x must have channels last"));
    const int64_t channels = x.dim_size(x.dims() - 1), pixels = x.NumElements() / std::max<int64_t>(channels, 1);
    OP_REQUIRES(context, scale.NumElements() == channels && offset.NumElements() == channels,
                tensorflow::errors::InvalidArgument("scale and offset must have one value per channel"));
    OP_REQUIRES(context, pixels > 0, tensorflow::errors::InvalidArgument("x must have pixels"));
    Tensor *y = nullptr, *mean = nullptr, *variance = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(context, context->allocate_output(1, tensorflow::TensorShape({channels}), &mean));
    OP_REQUIRES_OK(context, context->allocate_output(2, tensorflow::TensorShape({channels}), &variance));
    const int64_t parts = Parts(context, pixels);
    std::vector<std::vector<double>> first(parts, std::vector<double>(channels)),
        second(parts, std::vector<double>(channels));
    InParts(context, pixels, parts, [&](int64_t part, int64_t begin, int64_t end) {
      SumMoments(Bits(x), channels, begin, end, first[part].data(), second[part].data());
    });
    float* mean_values = mean->flat<float>().data();
    float* variance_values = variance->flat<float>().data();
    for (int64_t c = 0; c < channels; ++c) {
      const double average = PartsSum(first, c) / pixels;
      mean_values[c] = static_cast<float>(average);
      variance_values[c] = static_cast<float>(std::max(0.0, PartsSum(second, c) / pixels - average * average));
    }
    const Normalization n = Coefficients(mean_values, variance_values, scale.flat<float>().data(),
                                         offset.flat<float>().data(), channels, epsilon_);
    InParts(context, pixels, parts, [&](int64_t, int64_t begin, int64_t end) {
      NormalizeActivate(Bits(x), n.a.data(), n.b.data(), channels, begin, end, Bits(y));
    });
  }
};

class BatchNormGeluGradBf16 : public BatchNormGeluKernel {
 public:
  explicit BatchNormGeluGradBf16(OpKernelConstruction* context)
      : BatchNormGeluKernel(context, "BatchNormGeluGradBf16") {}

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& upstream = context->input(1);
    OP_REQUIRES(context, x.shape() == upstream.shape() && x.dims() >= 2,
                tensorflow::errors::InvalidArgument("x and upstream must be of one shape, channels last"));
    const int64_t channels = x.dim_size(x.dims() - 1), pixels = x.NumElements() / std::max<int64_t>(channels, 1);
    for (int input = 2; input < 6; ++input) {
      OP_REQUIRES(context, context->input(input).NumElements() == channels,
                  tensorflow::errors::InvalidArgument("mean, variance, scale and offset must have one value per "
                                                      "channel"));
    }
    OP_REQUIRES(context, pixels > 0, tensorflow::errors::InvalidArgument("x must have pixels"));
    Tensor *dx = nullptr, *d_scale = nullptr, *d_offset = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(context, context->allocate_output(1, tensorflow::TensorShape({channels}), &d_scale));
    OP_REQUIRES_OK(context, context->allocate_output(2, tensorflow::TensorShape({channels}), &d_offset));
    const Normalization n =
        Coefficients(context->input(2).flat<float>().data(), context->input(3).flat<float>().data(),
                     context->input(4).flat<float>().data(), context->input(5).flat<float>().data(), channels,
                     epsilon_);
    const int64_t parts = Parts(context, pixels);
    std::vector<std::vector<double>> g_sums(parts, std::vector<double>(channels)),
        g_xhat_sums(parts, std::vector<double>(channels));
    InParts(context, pixels, parts, [&](int64_t part, int64_t begin, int64_t end) {
      ActivationGradient(Bits(x), Bits(upstream), n.a.data(), n.b.data(), n.mean.data(), n.rstd.data(), channels,
                         begin, end, Bits(dx), g_sums[part].data(), g_xhat_sums[part].data());
    });
    std::vector<float> mean_g(channels), mean_g_xhat(channels);
    float* d_scale_values = d_scale->flat<float>().data();
    float* d_offset_values = d_offset->flat<float>().data();
    for (int64_t c = 0; c < channels; ++c) {
      const double sum = PartsSum(g_sums, c), sum_xhat = PartsSum(g_xhat_sums, c);
      d_offset_values[c] = static_cast<float>(sum);
      d_scale_values[c] = static_cast<float>(sum_xhat);
      mean_g[c] = static_cast<float>(sum / pixels);
      mean_g_xhat[c] = static_cast<float>(sum_xhat / pixels);
    }
    InParts(context, pixels, parts, [&](int64_t, int64_t begin, int64_t end) {
      InputGradient(Bits(x), n.a.data(), n.mean.data(), n.rstd.data(), mean_g.data(), mean_g_xhat.data(), channels,
                    begin, end, Bits(dx));
    });
  }
};

}  // namespace

REGISTER_OP("BatchNormGeluBf16")
    .Input("x: bfloat16")
    .Input("scale: float")
    .Input("offset: float")
    .Attr("epsilon: float")
    .Output("y: bfloat16")
    .Output("mean: float")
    .Output("variance: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      const auto channels = c->Rank(c->input(0)) == tensorflow::shape_inference::InferenceContext::kUnknownRank
                                ? c->UnknownDim()
                                : c->Dim(c->input(0), -1);
      c->set_output(1, c->Vector(channels));
      c->set_output(2, c->Vector(channels));
      return tensorflow::OkStatus();
    });

REGISTER_OP("BatchNormGeluGradBf16")
    .Input("x: bfloat16")
    .Input("upstream: bfloat16")
    .Input("mean: float")
    .Input("variance: float")
    .Input("scale: float")
    .Input("offset: float")
    .Attr("epsilon: float")
    .Output("x_gradient: bfloat16")
    .Output("scale_gradient: float")
    .Output("offset_gradient: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(4));
      c->set_output(2, c->input(5));
      return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("BatchNormGeluBf16").Device(tensorflow::DEVICE_CPU), BatchNormGeluBf16);
REGISTER_KERNEL_BUILDER(Name("BatchNormGeluGradBf16").Device(tensorflow::DEVICE_CPU), BatchNormGeluGradBf16);
