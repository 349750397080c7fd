// KernelGradientBf16: the kernel gradient of a stride-1 'same' convolution (channels last, odd kernel) in bfloat16,
// with AVX512-BF16 dot products: dW[r][s][i][o] = sum over images n and pixels (h, w) of
//   input[n][h + r - R/2][w + s - S/2][i] * upstream[n][h][w][o]   (zero outside the image), summed in float32.
// One matrix product per kernel row (its taps side by side), all rows from one packed chunk of the upstream
// gradient, so that the chunk is read from memory once for all of them; each row's shifted input is packed from the
// cache as it is needed. The packing interleaves two pixels per 32-bit pair, the layout the VDPBF16PS instruction
// multiplies. The threads take runs of the batch in turn, each summing into its own float32 copy of the gradient,
// added at the end. Out channels: a multiple of 32.
// Built by components/common/compiled_kernels.py (make install); used by components/common/model.py.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

// The arithmetic is compiled for AVX512-BF16; the rest, TensorFlow's headers included, as TensorFlow itself is.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16,fma")

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

constexpr int kPairsPerChunk = 128;  // pixel pairs of a packed chunk (128-384 within 2% of each other at every layer)
constexpr int64_t kRunPixels = 4096;  // pixels of a run of images a thread takes in its turn

// The permutations of VPERMT2W that interleave the first and the second 16 values of two vectors of 32 bfloat16.
inline __m512i FirstPairs() {
  return _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35,
                          3, 34, 2, 33, 1, 32, 0);
}
inline __m512i SecondPairs() {
  return _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54, 22, 53, 21, 52,
                          20, 51, 19, 50, 18, 49, 17, 48, 16);
}

// Interleave n bfloat16 values (a multiple of 32) of rows a and b (b null: zeros) into n 32-bit pairs (a[c], b[c]).
inline void Interleave(const uint16_t* a, const uint16_t* b, int n, uint32_t* out) {
  const __m512i low = FirstPairs(), high = SecondPairs();
  for (int c = 0; c < n; c += 32) {
    const __m512i va = _mm512_loadu_si512(a + c);
    const __m512i vb = b ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
    _mm512_storeu_si512(out + c, _mm512_permutex2var_epi16(va, low, vb));
    _mm512_storeu_si512(out + c + 16, _mm512_permutex2var_epi16(va, high, vb));
  }
}

// Interleave n bfloat16 values of a and b, reading only the elements set in the 32-bit masks (one a block of 32;
// the rest are zeros, so a and b may point outside their tensor where every element there is masked), into the
// packed panels of kPanel pairs each: pair c goes to panels[(c / kPanel) * panel_stride + c % kPanel].
template <int kPanel>
inline void InterleaveIntoPanels(const uint16_t* a, const uint32_t* a_masks, const uint16_t* b,
                                 const uint32_t* b_masks, int n, uint32_t* panels, int64_t panel_stride) {
  static_assert(kPanel == 8, "a zmm of 16 pairs fills two panels of 8");
  const __m512i low = FirstPairs(), high = SecondPairs();
  for (int c = 0, block = 0; c < n; c += 32, ++block) {
    const __m512i va = _mm512_maskz_loadu_epi16(a_masks[block], a + c);
    const __m512i vb = _mm512_maskz_loadu_epi16(b_masks[block], b + c);
    const __m512i first = _mm512_permutex2var_epi16(va, low, vb), second = _mm512_permutex2var_epi16(va, high, vb);
    uint32_t* panel = panels + (c / kPanel) * panel_stride;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel), _mm512_castsi512_si256(first));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + panel_stride), _mm512_extracti64x4_epi64(first, 1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + 2 * panel_stride), _mm512_castsi512_si256(second));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + 3 * panel_stride), _mm512_extracti64x4_epi64(second, 1));
  }
}

// Not inlined: compiled alone, its M x Z accumulators stay in registers (inlined into Accumulate, GCC spilled them
// to the stack inside the loop, 2.7x slower).
template <int M, int Z>
__attribute__((noinline)) void MicroKernel(const uint32_t* __restrict a, const uint32_t* __restrict b, int pairs,
                                           float* __restrict c, int ldc, int rows) {
  __m512 sum[M][Z];
  for (int i = 0; i < M; ++i)
    for (int z = 0; z < Z; ++z) sum[i][z] = _mm512_setzero_ps();
  for (int k = 0; k < pairs; ++k) {
    __m512bh bk[Z];
    for (int z = 0; z < Z; ++z) bk[z] = (__m512bh)_mm512_load_si512(b + (k * Z + z) * 16);
    for (int i = 0; i < M; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[k * M + i]));
      for (int z = 0; z < Z; ++z) sum[i][z] = _mm512_dpbf16_ps(sum[i][z], ai, bk[z]);
    }
  }
  for (int i = 0; i < rows; ++i)
    for (int z = 0; z < Z; ++z) {
      float* row = c + i * ldc + z * 16;
      _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), sum[i][z]));
    }
}

struct Shape {
  int64_t images, height, width, in_channels, out_channels, rows, columns;
};

// One thread's share, part `part` of `parts`: runs `part`, `part + parts`, ... of `run` images each, summed into
// gradient (rows x columns x in x out, float32, zeroed). Fixed by the part, not taken as they come, so that the
// sums, and so the training, are the same from run to run (taken as they come, the last bits differed). M x 16*Z
// is the register tile: 8 x 32 (against 6 x 64, 10 x 32 and 12 x 32 the best or level at every layer of the fast
// preset).
template <int M, int Z>
void Accumulate(const uint16_t* input, const uint16_t* upstream, const Shape& s, int64_t part, int64_t parts,
                int64_t run, float* gradient) {
  constexpr int kTile = 16 * Z;
  const int64_t pixels = s.height * s.width, in = s.in_channels, out = s.out_channels;
  // A kernel row's taps side by side: the input rows a pixel's taps in one kernel row read are adjacent pixels,
  // so one packing of columns x in values (each tap's in channels, masked where the tap falls outside the image)
  // gives the (columns x in) x out product of that kernel row, the gradient's layout.
  const int64_t row_values = s.columns * in, panels = (row_values + M - 1) / M, blocks = out / kTile;
  const int64_t mask_blocks = (row_values + 31) / 32, patterns = int64_t{1} << s.columns;
  std::vector<uint32_t> masks(patterns * mask_blocks, 0);  // [which taps are inside][block of 32 values]
  for (int64_t pattern = 0; pattern < patterns; ++pattern)
    for (int64_t value = 0; value < row_values; ++value)
      if (pattern >> (value / in) & 1) masks[pattern * mask_blocks + value / 32] |= 1u << (value % 32);
  std::vector<int64_t> column_pattern(s.width, 0);  // the taps of a kernel row inside the image at column w
  for (int64_t w = 0; w < s.width; ++w)
    for (int64_t t = 0; t < s.columns; ++t)
      if (w + t - s.columns / 2 >= 0 && w + t - s.columns / 2 < s.width) column_pattern[w] |= int64_t{1} << t;
  auto* packed_upstream = static_cast<uint32_t*>(std::aligned_alloc(64, 4 * kPairsPerChunk * out));
  // A panel's stride is not a multiple of 4 KB, so that a pair's values, written to every panel, fall in
  // different sets of the L1 cache (at 4 KB, 24 panels of 8 evict one another from a 12-way set: 3x slower).
  const int64_t panel_stride = kPairsPerChunk * M + 16;
  // Whole blocks of 32 values are written (4 panels each), zeros past the row's values.
  auto* packed_input = static_cast<uint32_t*>(std::aligned_alloc(64, 4 * panel_stride * mask_blocks * 32 / M));
  std::vector<int64_t> pixel_h(2 * kPairsPerChunk), pixel_w(2 * kPairsPerChunk);
  for (int64_t first = part * run; first < s.images; first += parts * run) {
    const int64_t begin = first * pixels, end = std::min(first + run, s.images) * pixels;
    for (int64_t start = begin; start < end; start += 2 * kPairsPerChunk) {
      const int pairs = static_cast<int>(std::min<int64_t>(kPairsPerChunk, (end - start + 1) / 2));
      for (int k = 0; k < pairs; ++k) {  // the upstream gradient, packed once for all taps: [block][pair][kTile]
        const int64_t pixel = start + 2 * k;
        const uint16_t* first_row = upstream + pixel * out;
        const uint16_t* second_row = pixel + 1 < end ? first_row + out : nullptr;
        for (int64_t block = 0; block < blocks; ++block)
          Interleave(first_row + block * kTile, second_row ? second_row + block * kTile : nullptr, kTile,
                     packed_upstream + (block * kPairsPerChunk + k) * kTile);
      }
      int64_t h = (start % pixels) / s.width, w = start % s.width;  // each pixel's place in its image
      for (int j = 0; j < 2 * pairs; ++j) {
        const bool inside = start + j < end;
        pixel_h[j] = inside ? h : -(int64_t{1} << 40);
        pixel_w[j] = inside ? w : 0;
        if (++w == s.width) {
          w = 0;
          if (++h == s.height) h = 0;
        }
      }
      for (int64_t r = 0; r < s.rows; ++r) {
        const int64_t dh = r - s.rows / 2;
        for (int k = 0; k < pairs; ++k) {  // the kernel row's shifted input, packed: [panel][pair][M]
          const uint16_t* rows[2];
          const uint32_t* row_masks[2];
          for (int j = 0; j < 2; ++j) {
            const int64_t pixel = 2 * k + j, y = pixel_h[pixel] + dh;
            const int64_t pattern = (y >= 0 && y < s.height) ? column_pattern[pixel_w[pixel]] : 0;
            const int64_t offset = (start + pixel + dh * s.width - s.columns / 2) * in;  // may be outside: masked
            rows[j] = reinterpret_cast<const uint16_t*>(reinterpret_cast<intptr_t>(input) +
                                                        offset * static_cast<intptr_t>(sizeof(uint16_t)));
            row_masks[j] = masks.data() + pattern * mask_blocks;
          }
          InterleaveIntoPanels<M>(rows[0], row_masks[0], rows[1], row_masks[1], static_cast<int>(row_values),
                                  packed_input + k * M, panel_stride);
        }
        float* kernel_row = gradient + r * row_values * out;
        for (int64_t block = 0; block < blocks; ++block)
          for (int64_t panel = 0; panel < panels; ++panel)
            MicroKernel<M, Z>(packed_input + panel * panel_stride, packed_upstream + block * kPairsPerChunk * kTile,
                              pairs, kernel_row + panel * M * out + block * kTile, static_cast<int>(out),
                              static_cast<int>(std::min<int64_t>(M, row_values - panel * M)));
      }
    }
  }
  std::free(packed_upstream);
  std::free(packed_input);
}

#pragma GCC pop_options

class KernelGradientBf16 : public OpKernel {
 public:
  explicit KernelGradientBf16(OpKernelConstruction* context) : OpKernel(context) {
    std::vector<int64_t> kernel_size;
    OP_REQUIRES_OK(context, context->GetAttr("kernel_size", &kernel_size));
    OP_REQUIRES(context, kernel_size.size() == 2 && kernel_size[0] % 2 == 1 && kernel_size[1] % 2 == 1,
                tensorflow::errors::InvalidArgument("kernel_size must be two odd numbers"));
    rows_ = kernel_size[0];
    columns_ = kernel_size[1];
    OP_REQUIRES(context, __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw"),
                tensorflow::errors::Unimplemented("KernelGradientBf16 needs a CPU with AVX512-BF16"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    const Tensor& upstream = context->input(1);
    OP_REQUIRES(context, input.dims() == 4 && upstream.dims() == 4,
                tensorflow::errors::InvalidArgument("input and upstream must be 4-D (images, height, width, "
                                                    "channels)"));
    const Shape s{input.dim_size(0), input.dim_size(1), input.dim_size(2), input.dim_size(3), upstream.dim_size(3),
                  rows_, columns_};
    OP_REQUIRES(context,
                upstream.dim_size(0) == s.images && upstream.dim_size(1) == s.height &&
                    upstream.dim_size(2) == s.width,
                tensorflow::errors::InvalidArgument("upstream must have the input's images, height and width"));
    OP_REQUIRES(context, s.out_channels % 32 == 0,
                tensorflow::errors::InvalidArgument("out channels must be a multiple of 32, got ", s.out_channels));
    Tensor* gradient = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, tensorflow::TensorShape({s.rows, s.columns, s.in_channels, s.out_channels}),
                                &gradient));
    const int64_t size = s.rows * s.columns * s.in_channels * s.out_channels;
    float* result = gradient->flat<float>().data();
    const auto* input_data = reinterpret_cast<const uint16_t*>(input.flat<Eigen::bfloat16>().data());
    const auto* upstream_data = reinterpret_cast<const uint16_t*>(upstream.flat<Eigen::bfloat16>().data());
    auto* workers = context->device()->tensorflow_cpu_worker_threads()->workers;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(workers->NumThreads(), s.images));
    std::vector<std::vector<float>> sums(parts, std::vector<float>(size, 0.0f));
    // Runs of about kRunPixels pixels, at least 8 a thread, taken by the threads in turn.
    const int64_t run = std::max<int64_t>(1, std::min(kRunPixels / (s.height * s.width), s.images / (8 * parts)));
    auto work = [&](int64_t first_part, int64_t last_part) {
      for (int64_t part = first_part; part < last_part; ++part) {
        Accumulate<8, 2>(input_data, upstream_data, s, part, parts, run, sums[part].data());
      }
    };
    workers->ParallelFor(parts, /*cost_per_unit=*/int64_t{1} << 40, work);
    for (int64_t i = 0; i < size; ++i) {
      float total = 0.0f;
      for (int64_t part = 0; part < parts; ++part) total += sums[part][i];
      result[i] = total;
    }
  }

 private:
  int64_t rows_ = 3, columns_ = 3;
};

}  // namespace

REGISTER_OP("KernelGradientBf16")
    .Input("input: bfloat16")
    .Input("upstream: bfloat16")
    .Attr("kernel_size: list(int)")
    .Output("gradient: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<int64_t> kernel_size;
      TF_RETURN_IF_ERROR(c->GetAttr("kernel_size", &kernel_size));
      if (kernel_size.size() != 2) return tensorflow::errors::InvalidArgument("kernel_size must have two numbers");
      c->set_output(0, c->MakeShape({c->MakeDim(kernel_size[0]), c->MakeDim(kernel_size[1]),
                                     c->Dim(c->input(0), 3), c->Dim(c->input(1), 3)}));
      return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("KernelGradientBf16").Device(tensorflow::DEVICE_CPU), KernelGradientBf16);
