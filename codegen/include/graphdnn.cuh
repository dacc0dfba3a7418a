// graphdnn device helpers: element conversions that round as the reference backend does,
// vector access, reductions and the activation functions. Inlined into every kernel;
// the fp16/bf16/fp8 parts compile only when the kernel includes those CUDA headers.
#pragma once

namespace gd {

// ---- element conversions ---------------------------------------------------------------
// Elem<T>::get turns a stored element into the compute type; Elem<T>::put rounds a
// compute value into T as graphdnn.dtypes.round_to does: nearest-even for floats;
// nearest-even then saturation for integers, NaN becoming 0 (cvt.rni.sat); "non-zero"
// for bool; fp8 overflows as the reference does (e4m3: NaN, e5m2: inf).
template <class T> struct Elem;

template <> struct Elem<float> {
  __device__ __forceinline__ static float get(float x) { return x; }
  __device__ __forceinline__ static float put(float v) { return v; }
  __device__ __forceinline__ static float put(double v) { return (float)v; }
};

template <> struct Elem<double> {
  __device__ __forceinline__ static double get(double x) { return x; }
  __device__ __forceinline__ static double put(double v) { return v; }
};

template <> struct Elem<bool> {
  __device__ __forceinline__ static float get(bool x) { return x ? 1.0f : 0.0f; }
  __device__ __forceinline__ static bool put(double v) { return v == v && v != 0.0; }
};

// The comparisons are in the compute type V: (V)HI may round up (int32's maximum as a float,
// int64's as a double), and any v at or above it saturates to HI, as round_to saturates.
template <class I, long long LO, long long HI> struct IntElem {
  __device__ __forceinline__ static float get(I x) { return (float)x; }
  template <class V> __device__ __forceinline__ static I put(V v) {
    if (v != v) return 0;
    v = rint(v);  // nearest, ties to even
    if (v <= (V)LO) return (I)LO;
    if (v >= (V)HI) return (I)HI;
    return (I)v;
  }
};
template <> struct Elem<signed char> : IntElem<signed char, -128, 127> {};
template <> struct Elem<unsigned char> : IntElem<unsigned char, 0, 255> {};
template <> struct Elem<int> : IntElem<int, -2147483647LL - 1, 2147483647LL> {};
template <> struct Elem<long long> : IntElem<long long, -9223372036854775807LL - 1, 9223372036854775807LL> {};

#ifdef __CUDA_FP16_H__
template <> struct Elem<__half> {
  __device__ __forceinline__ static float get(__half x) { return __half2float(x); }
  __device__ __forceinline__ static __half put(float v) { return __float2half_rn(v); }
  __device__ __forceinline__ static __half put(double v) { return __double2half(v); }
};
#endif

#ifdef __CUDA_BF16_H__
template <> struct Elem<__nv_bfloat16> {
  __device__ __forceinline__ static float get(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 put(float v) { return __float2bfloat16_rn(v); }
  __device__ __forceinline__ static __nv_bfloat16 put(double v) { return __double2bfloat16(v); }
};
#endif

#ifdef __CUDA_FP8_H__
// Both fp8 formats; FORMAT picks the encoding. No saturation, as the reference rounds.
// From sm_89, a float in range converts with one cvt (nearest even, as the reference); only
// NaN and overflow, which cvt would saturate, take the branch: e4m3 has no inf (NaN past 464),
// e5m2 overflows to inf from 61440 (ml_dtypes' bits, sign kept). The library's NOSAT
// conversion is a long software routine: inlined per element, it made each fp8 kernel 5x
// slower to compile and every conversion dozens of instructions.
template <class F, __nv_fp8_interpretation_t FORMAT> struct Fp8Elem {
  __device__ __forceinline__ static float get(F x) { return (float)x; }
  __device__ __forceinline__ static F put(float v) {
    F r;
#if __CUDA_ARCH__ >= 890
    const unsigned int sign = (__float_as_uint(v) >> 24) & 0x80u;
    if (FORMAT == __NV_E4M3) {
      if (!(fabsf(v) <= 464.0f)) {
        r.__x = (__nv_fp8_storage_t)(sign | 0x7fu);
        return r;
      }
      unsigned short pair;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(v));
      r.__x = (__nv_fp8_storage_t)(pair & 0xffu);
    } else {
      if (!(fabsf(v) < 61440.0f)) {
        r.__x = (__nv_fp8_storage_t)(sign | (v != v ? 0x7eu : 0x7cu));
        return r;
      }
      unsigned short pair;
      asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(v));
      r.__x = (__nv_fp8_storage_t)(pair & 0xffu);
    }
#else
    r.__x = __nv_cvt_float_to_fp8(v, __NV_NOSAT, FORMAT);
#endif
    return r;
  }
  __device__ __forceinline__ static F put(double v) {
    F r;
    r.__x = __nv_cvt_double_to_fp8(v, __NV_NOSAT, FORMAT);
    return r;
  }
};
template <> struct Elem<__nv_fp8_e4m3> : Fp8Elem<__nv_fp8_e4m3, __NV_E4M3> {};
template <> struct Elem<__nv_fp8_e5m2> : Fp8Elem<__nv_fp8_e5m2, __NV_E5M2> {};

// E8M0 (OCP MX scales): the byte is the biased exponent of a power of two, 0 is 2^-127 and
// 255 NaN. Rounded by hand as ml_dtypes rounds (CUDA's __nv_cvt_float_to_e8m0 rounds |x| up or
// toward zero, never to nearest, and keeps negative values and zero as powers of two):
// to the nearer power of two with ties up (2^-127, the smallest, up to 1.5 * 2^-127), and zero,
// negatives, inf, NaN and overflow to NaN. A double goes through float first.
template <> struct Elem<__nv_fp8_e8m0> {
  __device__ __forceinline__ static float get(__nv_fp8_e8m0 x) {
    const unsigned code = x.__x;
    if (code == 255u) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(code == 0u ? 0x00400000u : code << 23);
  }
  __device__ __forceinline__ static __nv_fp8_e8m0 put(float v) {
    __nv_fp8_e8m0 r;
    const unsigned bits = __float_as_uint(v), exponent = bits >> 23, mantissa = bits & 0x7fffffu;
    unsigned code;
    if (!(v > 0.0f) || exponent == 255u) code = 255u;
    else if (exponent == 0u) code = mantissa >= 0x600000u ? 1u : 0u;  // float subnormal: 1.5 * 2^-127 ties up
    else code = min(exponent + (mantissa >= 0x400000u ? 1u : 0u), 255u);
    r.__x = (__nv_fp8_storage_t)code;
    return r;
  }
  __device__ __forceinline__ static __nv_fp8_e8m0 put(double v) { return put((float)v); }
};
#endif

// to<C>(x): a stored element as compute type C; from<T>(v): a compute value stored as T.
// Integers convert straight to the compute type (Elem<I>::get gives a float, which would round
// int32 / int64 values past 2^24 on their way to a double).
template <class T> struct IsInteger { static constexpr bool value = false; };
template <> struct IsInteger<signed char> { static constexpr bool value = true; };
template <> struct IsInteger<unsigned char> { static constexpr bool value = true; };
template <> struct IsInteger<int> { static constexpr bool value = true; };
template <> struct IsInteger<long long> { static constexpr bool value = true; };
template <class C, class T> __device__ __forceinline__ C to(T x) {
  if constexpr (IsInteger<T>::value) {
    return (C)x;
  } else {
    return (C)Elem<T>::get(x);
  }
}
template <class T, class C> __device__ __forceinline__ T from(C v) { return Elem<T>::put(v); }

// rounded<T>(v): the compute value v rounded to T and back, the value of a virtual tensor of
// type T inside a fused kernel. bf16 from float: one packed conversion whose low half is zero
// leaves exactly the rounded float (convert-then-shift-back takes two instructions).
template <class T, class C> __device__ __forceinline__ C rounded(C v) { return to<C>(from<T>(v)); }
#ifdef __CUDA_BF16_H__
template <> __device__ __forceinline__ float rounded<__nv_bfloat16, float>(float v) {
  unsigned bits;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(v), "f"(0.0f));  // high half: v as bf16
  return __uint_as_float(bits);
}
#endif

// ---- vector access ---------------------------------------------------------------------
// N elements of T moved as one aligned access (16 bytes for the usual N).
template <class T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <class T, int N> __device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <class T, int N> __device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// element<C>(v, e): element e of a vector as compute type C.
template <class C, class T, int N> __device__ __forceinline__ C element(const Vec<T, N>& v, int e) {
  return to<C>(v.v[e]);
}
#ifdef __CUDA_BF16_H__
// bf16 pairs share a 32-bit word and a bf16 is the upper half of a float: one shift (even
// element) or mask (odd element) per element, where converting an extracted halfword costs two.
template <class C, int N> __device__ __forceinline__ C element(const Vec<__nv_bfloat16, N>& v, int e) {
  if constexpr (N % 2 == 0) {
    const unsigned word = reinterpret_cast<const unsigned*>(v.v)[e / 2];
    return (C)__uint_as_float(e % 2 ? word & 0xffff0000u : word << 16);
  } else {
    return to<C>(v.v[e]);
  }
}
#endif

// hold(v): keep v, as computed, in a register. The compiler may instead re-derive a value
// where it is used to save registers (unpack a loop-invariant vector again in every
// iteration); an empty asm it cannot see through makes the computed value the only source.
__device__ __forceinline__ void hold(float& v) { asm volatile("" : "+f"(v)); }
__device__ __forceinline__ void hold(double& v) { asm volatile("" : "+d"(v)); }

// ---- reductions ------------------------------------------------------------------------
// `op` is a functor combining two values (sum, product, NaN-propagating min/max...); the
// combination order is fixed by the thread layout, so results are reproducible run to run.
template <class T> __device__ __forceinline__ T shfl_xor(T v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}

// A value and its index along a reduced axis: what argmax / argmin reduce.
template <class C> struct Arg {
  C value;
  long long index;
};
template <class C> __device__ __forceinline__ Arg<C> shfl_xor(Arg<C> v, int offset) {
  return {shfl_xor(v.value, offset), shfl_xor(v.index, offset)};
}

// The preferred of two Args under a total order, so any combination order gives the same
// result: the larger (MAX) or smaller value, NaN before every number, the smaller index on ties.
template <bool MAX> struct ArgBest {
  template <class C> __device__ __forceinline__ Arg<C> operator()(Arg<C> a, Arg<C> b) const {
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan || b_nan) return a_nan && (!b_nan || a.index < b.index) ? a : b;
    if (a.value == b.value) return a.index < b.index ? a : b;
    return (MAX ? a.value > b.value : a.value < b.value) ? a : b;
  }
};

template <int WIDTH, class T, class Op> __device__ __forceinline__ T lanes_reduce(T v, Op op) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset >>= 1) v = op(v, shfl_xor(v, offset));
  return v;
}

// group_sum with any `op`: every thread of a group of GROUP consecutive threads (a power of
// 2) gets the group's total; `scratch` holds blockDim.x / 32 values. Contains __syncthreads
// when GROUP > 32, so all threads of the block must call it.
template <int GROUP, class T, class Op> __device__ __forceinline__ T group_reduce(T v, T* scratch, Op op) {
  if constexpr (GROUP <= 32) {
    return lanes_reduce<GROUP>(v, op);
  } else {
    constexpr int WARPS = GROUP / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = lanes_reduce<32>(v, op);
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int first = (warp / WARPS) * WARPS;
    return lanes_reduce<(WARPS < 32 ? WARPS : 32)>(scratch[first + lane % WARPS], op);
  }
}

struct Sum {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return max(a, b); }
};

// max that keeps NaN (a block maximum of block_scale_quantize is NaN when the block holds one).
struct NanMax {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};

// ---- top-k ---------------------------------------------------------------------------------
// The order topk and moe_router select in: NaN first, then larger values, then lower indices.
template <class T> __device__ __forceinline__ bool ranks_before(T av, long long ai, T bv, long long bi) {
  const bool a_nan = av != av, b_nan = bv != bv;
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && av != bv) return av > bv;
  return ai < bi;
}

// The first of the warp's candidates (v, i) in that order, on every lane; i < 0 is no
// candidate. A total order has one first element, so every lane reaches the same one.
template <class T> __device__ __forceinline__ void warp_first(T& v, long long& i) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T other_v = __shfl_xor_sync(0xffffffffu, v, offset);
    const long long other_i = __shfl_xor_sync(0xffffffffu, i, offset);
    if (other_i >= 0 && (i < 0 || ranks_before(other_v, other_i, v, i))) {
      v = other_v;
      i = other_i;
    }
  }
}

// Sum (max) over the WIDTH consecutive lanes of a warp (WIDTH a power of 2 <= 32).
template <int WIDTH, class T> __device__ __forceinline__ T lanes_sum(T v) { return lanes_reduce<WIDTH>(v, Sum()); }
template <int WIDTH, class T> __device__ __forceinline__ T lanes_max(T v) { return lanes_reduce<WIDTH>(v, Max()); }

// Sum (max) over a group of GROUP consecutive threads; see group_reduce.
template <int GROUP, class T> __device__ __forceinline__ T group_sum(T v, T* scratch) {
  return group_reduce<GROUP>(v, scratch, Sum());
}
template <int GROUP, class T> __device__ __forceinline__ T group_max(T v, T* scratch) {
  return group_reduce<GROUP>(v, scratch, Max());
}

// ---- activations ---------------------------------------------------------------------------
// The hardware exp2 and reciprocal (~2 ulp). Results below 2^-126 flush to zero: where they
// are used here (1 + e, 1 / (1 + e)) that changes nothing a float can hold.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// a + b^2 with b evaluated once (b may be a whole fused expression).
template <class T> __device__ __forceinline__ T add_square(T a, T b) { return a + b * b; }

template <class T> __device__ __forceinline__ T sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }
// float: the hardware exp2 and reciprocal (~1e-6 relative error, a third of the instructions;
// the activations sit in memory-bound kernels where precise exp and division would make
// them issue-bound). 1 + e^-x overflowing to inf gives exactly 0.
template <> __device__ __forceinline__ float sigmoid<float>(float x) {
  return rcp_approx(1.0f + exp2_approx(-1.44269504088896340736f * x));
}

template <class T> __device__ __forceinline__ T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440)));
}

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
template <class T> __device__ __forceinline__ T gelu_tanh(T x) {
  const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return x * sigmoid<T>(T(2) * u);
}
// float: x / (1 + 2^(-2u log2 e)) with the constants folded, -2u log2 e = x (A + B x^2): seven
// instructions (two of them MUFU) per element.
template <> __device__ __forceinline__ float gelu_tanh<float>(float x) {
  constexpr float A = (float)(-2.0 * 0.79788456080286535588 * 1.44269504088896340736);
  constexpr float B = (float)(-2.0 * 0.79788456080286535588 * 0.044715 * 1.44269504088896340736);
  return x * rcp_approx(1.0f + exp2_approx(x * fmaf(B, x * x, A)));
}

template <class T> __device__ __forceinline__ T softplus(T x, T beta) {
  const T z = beta * x;
  return z > T(20) ? x : log1p(exp(z)) / beta;  // past 20 the correction is below float resolution
}

template <class T> __device__ __forceinline__ T relu_clip(T x, T slope, T lower, T upper) {
  return x > lower ? min(x, upper) : lower + slope * (x - lower);
}

template <class T> __device__ __forceinline__ T elu(T x, T alpha) { return x > T(0) ? x : alpha * expm1(x); }

// ---- random numbers ---------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., SC'11, the Random123 constants): graphdnn.ops.random computes the
// same 32-bit words in NumPy, so masks drawn from it are bit-identical to the reference's.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round) k = make_uint2(k.x + 0x9E3779B9u, k.y + 0xBB67AE85u);
    const unsigned hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

// rng's Bernoulli draw for the element of row-major index i: word 0 of the block at key
// (seed_lo, seed_hi) and counter (i_lo, i_hi, offset_lo, offset_hi); u = (word0 >> 8) / 2^24
// is below p exactly when word0 >> 8 is below threshold = ceil(p 2^24).
__device__ __forceinline__ bool bernoulli(unsigned long long seed, unsigned long long offset, unsigned long long i,
                                          unsigned threshold) {
  const uint4 r = philox4x32_10(make_uint4((unsigned)i, (unsigned)(i >> 32), (unsigned)offset, (unsigned)(offset >> 32)),
                                make_uint2((unsigned)seed, (unsigned)(seed >> 32)));
  return (r.x >> 8) < threshold;
}

// ---- activation derivatives (the *_backward ops: loss * f'(x), x the forward input) ---------
// sigmoid'(x) = e / (1 + e)^2 with e = e^-|x|, and tanh'(x) = 4 e / (1 + e)^2 with e = e^-2|x|:
// one exponential, and no 1 - s or 1 - t^2 cancelling where the slope is small.
template <class T> __device__ __forceinline__ T sigmoid_grad(T x) {
  const T e = exp(-fabs(x)), d = T(1) + e;
  return e / (d * d);
}
template <class T> __device__ __forceinline__ T tanh_grad(T x) {
  const T e = exp(T(-2) * fabs(x)), d = T(1) + e;
  return T(4) * e / (d * d);
}

// Phi(x) + x phi(x).
template <class T> __device__ __forceinline__ T gelu_erf_grad(T x) {
  return T(0.5) * (T(1) + erf(x * T(0.70710678118654752440))) + x * T(0.39894228040143267794) * exp(T(-0.5) * x * x);
}

// d/dx 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
template <class T> __device__ __forceinline__ T gelu_tanh_grad(T x) {
  const T t = tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(0.79788456080286535588) * (T(1) + T(0.134145) * x * x);
}

// s (1 + beta x (1 - s)), s = sigmoid(beta x).
template <class T> __device__ __forceinline__ T swish_grad(T x, T beta) {
  const T s = sigmoid<T>(beta * x);
  return s * (T(1) + beta * x * (T(1) - s));
}

// Threads laid out as ROWS x COLUMNS (threadIdx.x = row * COLUMNS + column, ROWS a power of
// 2) combine their N values down each column: a fixed-order tree through shared memory.
// Every thread ends with its column's totals. `scratch` holds ROWS * COLUMNS * N values;
// all threads of the block (exactly ROWS * COLUMNS) must call it.
template <int COLUMNS, int ROWS, int N, class T, class Op>
__device__ __forceinline__ void column_reduce(T (&v)[N], T* scratch, Op op) {
  const int column = threadIdx.x % COLUMNS, row = threadIdx.x / COLUMNS;
  __syncthreads();  // scratch may still be read from a previous call
#pragma unroll
  for (int i = 0; i < N; ++i) scratch[(row * N + i) * COLUMNS + column] = v[i];
  __syncthreads();
#pragma unroll
  for (int half = ROWS / 2; half > 0; half >>= 1) {
    if (row < half) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        T& mine = scratch[(row * N + i) * COLUMNS + column];
        mine = op(mine, scratch[((row + half) * N + i) * COLUMNS + column]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = scratch[i * COLUMNS + column];
}

}  // namespace gd
