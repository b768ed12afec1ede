// The AVX-512 intrinsics quant_isa_avx512.cpp uses, in portable C, so that its code runs
// and is tested on CPUs without AVX-512 (tests/kernels/emulated_avx512.py builds the module
// with TOKENWIRE_QUANT_EMULATE_AVX512). SIMDe (Debian's libsimde-dev) supplies them under
// their Intel names; the few the packaged SIMDe 0.7.4 lacks are written here, lane by lane,
// as the Intel manual defines them. Never part of a served build: emulation is slow.
#pragma once

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace tokenwire::quant::emulated {

inline simde__m512 cvtepi32_ps(simde__m512i a) {
  simde__m512i_private in = simde__m512i_to_private(a);
  simde__m512_private out;
  for (int i = 0; i < 16; ++i) out.f32[i] = static_cast<float>(in.i32[i]);
  return simde__m512_from_private(out);
}

// Round to nearest even (the default MXCSR mode); NaN and out-of-range give INT32_MIN.
inline simde__m512i cvtps_epi32(simde__m512 a) {
  simde__m512_private in = simde__m512_to_private(a);
  simde__m512i_private out;
  for (int i = 0; i < 16; ++i) {
    const float r = std::nearbyint(in.f32[i]);
    out.i32[i] = r >= -2147483648.f && r < 2147483648.f ? static_cast<int32_t>(r)
                                                         : std::numeric_limits<int32_t>::min();
  }
  return simde__m512i_from_private(out);
}

// vpmovdb: the low byte of each lane.
inline simde__m128i cvtepi32_epi8(simde__m512i a) {
  simde__m512i_private in = simde__m512i_to_private(a);
  simde__m128i_private out;
  for (int i = 0; i < 16; ++i) out.i8[i] = static_cast<int8_t>(in.i32[i] & 0xff);
  return simde__m128i_from_private(out);
}

inline simde__m512i cvtepu8_epi32(simde__m128i a) {
  simde__m128i_private in = simde__m128i_to_private(a);
  simde__m512i_private out;
  for (int i = 0; i < 16; ++i) out.i32[i] = in.u8[i];
  return simde__m512i_from_private(out);
}

// In GCC's order (halves of 256, 128, 64 bits, then the last pair), so sums round as the
// real instruction sequence does.
inline float reduce_add_ps(simde__m512 a) {
  simde__m512_private in = simde__m512_to_private(a);
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = in.f32[i];
  for (int width = 8; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) v[i] += v[i + width];
  return v[0];
}

inline float reduce_max_ps(simde__m512 a) {
  simde__m512_private in = simde__m512_to_private(a);
  float m = in.f32[0];
  for (int i = 1; i < 16; ++i) m = in.f32[i] > m ? in.f32[i] : m;
  return m;
}

inline simde__m512 zextps128_ps512(simde__m128 a) {
  simde__m128_private in = simde__m128_to_private(a);
  simde__m512_private out = simde__m512_to_private(simde_mm512_setzero_ps());
  for (int i = 0; i < 4; ++i) out.f32[i] = in.f32[i];
  return simde__m512_from_private(out);
}

inline simde__m512 zextps256_ps512(simde__m256 a) {
  simde__m256_private in = simde__m256_to_private(a);
  simde__m512_private out = simde__m512_to_private(simde_mm512_setzero_ps());
  for (int i = 0; i < 8; ++i) out.f32[i] = in.f32[i];
  return simde__m512_from_private(out);
}

// The masked loads and stores and the 16-lane half conversion the panels use
// (quant_panels.h), which SIMDe lacks.
inline simde__m512 maskz_loadu_ps(simde__mmask16 mask, const float* p) {
  simde__m512_private out = simde__m512_to_private(simde_mm512_setzero_ps());
  for (int i = 0; i < 16; ++i)
    if (mask >> i & 1) out.f32[i] = p[i];
  return simde__m512_from_private(out);
}

inline void mask_storeu_ps(float* p, simde__mmask16 mask, simde__m512 a) {
  simde__m512_private in = simde__m512_to_private(a);
  for (int i = 0; i < 16; ++i)
    if (mask >> i & 1) p[i] = in.f32[i];
}

inline simde__m256i maskz_loadu_epi16(simde__mmask16 mask, const void* p) {
  simde__m256i_private out = simde__m256i_to_private(simde_mm256_setzero_si256());
  for (int i = 0; i < 16; ++i)
    if (mask >> i & 1) out.u16[i] = static_cast<const uint16_t*>(p)[i];
  return simde__m256i_from_private(out);
}

inline simde__m512 cvtph_ps(simde__m256i a) {
  simde__m256i_private in = simde__m256i_to_private(a);
  simde__m512_private out;
  for (int h = 0; h < 2; ++h) {
    simde__m256_private part = simde__m256_to_private(simde_mm256_cvtph_ps(in.m128i[h]));
    for (int i = 0; i < 8; ++i) out.f32[8 * h + i] = part.f32[i];
  }
  return simde__m512_from_private(out);
}

}  // namespace tokenwire::quant::emulated

#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#define _MM_FROUND_TO_NEAREST_INT SIMDE_MM_FROUND_TO_NEAREST_INT
#define _MM_HINT_T0 SIMDE_MM_HINT_T0
#define __m128 simde__m128
#define __m128i simde__m128i
#define __m256 simde__m256
#define __m512 simde__m512
#define __m512i simde__m512i
#define __mmask16 simde__mmask16
#define __m256i simde__m256i
#define _mm256_maskz_loadu_epi16 tokenwire::quant::emulated::maskz_loadu_epi16
#define _mm512_castps_si512 simde_mm512_castps_si512
#define _mm512_cvtph_ps tokenwire::quant::emulated::cvtph_ps
#define _mm512_mask_storeu_ps tokenwire::quant::emulated::mask_storeu_ps
#define _mm512_maskz_loadu_ps tokenwire::quant::emulated::maskz_loadu_ps
#define _mm512_set1_epi32 simde_mm512_set1_epi32
#define _mm512_shuffle_i32x4 simde_mm512_shuffle_i32x4
#define _mm512_storeu_si512 simde_mm512_storeu_si512
#define _mm256_add_ps simde_mm256_add_ps
#define _mm256_castpd_ps simde_mm256_castpd_ps
#define _mm256_castps256_ps128 simde_mm256_castps256_ps128
#define _mm256_cvtph_ps simde_mm256_cvtph_ps
#define _mm256_extractf128_ps simde_mm256_extractf128_ps
#define _mm256_loadu_ps simde_mm256_loadu_ps
#define _mm512_abs_ps simde_mm512_abs_ps
#define _mm512_add_epi32 simde_mm512_add_epi32
#define _mm512_add_ps simde_mm512_add_ps
#define _mm512_and_si512 simde_mm512_and_si512
#define _mm512_castps512_ps256 simde_mm512_castps512_ps256
#define _mm512_castps_pd simde_mm512_castps_pd
#define _mm512_cvtepi32_epi8 tokenwire::quant::emulated::cvtepi32_epi8
#define _mm512_cvtepi32_ps tokenwire::quant::emulated::cvtepi32_ps
#define _mm512_cvtepu8_epi32 tokenwire::quant::emulated::cvtepu8_epi32
#define _mm512_cvtps_epi32 tokenwire::quant::emulated::cvtps_epi32
#define _mm512_dpbusd_epi32 simde_mm512_dpbusd_epi32
#define _mm512_extractf64x4_pd simde_mm512_extractf64x4_pd
#define _mm512_fmadd_ps simde_mm512_fmadd_ps
#define _mm512_load_si512 simde_mm512_load_si512
#define _mm512_loadu_ps simde_mm512_loadu_ps
#define _mm512_loadu_si512 simde_mm512_loadu_si512
#define _mm512_max_ps simde_mm512_max_ps
#define _mm512_mul_ps simde_mm512_mul_ps
#define _mm512_permutexvar_ps simde_mm512_permutexvar_ps
#define _mm512_reduce_add_ps tokenwire::quant::emulated::reduce_add_ps
#define _mm512_reduce_max_ps tokenwire::quant::emulated::reduce_max_ps
#define _mm512_roundscale_ps simde_mm512_roundscale_ps
#define _mm512_set1_epi8 simde_mm512_set1_epi8
#define _mm512_set1_ps simde_mm512_set1_ps
#define _mm512_setzero_ps simde_mm512_setzero_ps
#define _mm512_setzero_si512 simde_mm512_setzero_si512
#define _mm512_slli_epi32 simde_mm512_slli_epi32
#define _mm512_srli_epi16 simde_mm512_srli_epi16
#define _mm512_store_si512 simde_mm512_store_si512
#define _mm512_storeu_ps simde_mm512_storeu_ps
#define _mm512_sub_ps simde_mm512_sub_ps
#define _mm512_unpackhi_epi32 simde_mm512_unpackhi_epi32
#define _mm512_unpackhi_epi64 simde_mm512_unpackhi_epi64
#define _mm512_unpacklo_epi32 simde_mm512_unpacklo_epi32
#define _mm512_unpacklo_epi64 simde_mm512_unpacklo_epi64
#define _mm512_zextps128_ps512 tokenwire::quant::emulated::zextps128_ps512
#define _mm512_zextps256_ps512 tokenwire::quant::emulated::zextps256_ps512
#define _mm_add_ps simde_mm_add_ps
#define _mm_cvtph_ps simde_mm_cvtph_ps
#define _mm_load_si128 simde_mm_load_si128
#define _mm_loadl_epi64 simde_mm_loadl_epi64
#define _mm_loadu_ps simde_mm_loadu_ps
#define _mm_loadu_si128 simde_mm_loadu_si128
#define _mm_prefetch simde_mm_prefetch
#define _mm_storeu_ps simde_mm_storeu_ps
#define _mm_storeu_si128 simde_mm_storeu_si128
