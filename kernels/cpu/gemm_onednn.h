// oneDNN's matmul behind kernels/cpu/gemm.h (internal to kernels/cpu). A
// build without oneDNN gets the inline stand-ins below: not available, so
// gemm.cc always takes Eigen.
//
// Thread safety: as gemm.h; primitives are made once per shape and shared.
#pragma once

#include <string>

#include "kernels/cpu/gemm.h"

namespace gridsync::cpu::onednn {

#if GRIDSYNC_HAVE_ONEDNN
// Whether oneDNN's CPU engine could be made here.
bool Available();
// Whether the CPU multiplies bf16 natively (AVX-512 BF16 or AMX), as
// oneDNN sees it.
bool NativeBf16();
std::string EngineName(MatmulFormat format);
// gemm.h's Gemm in fp32 and GemmBf16; false where oneDNN has no
// implementation for the shape (the caller then takes Eigen).
bool Gemm(int m, int n, int k, const GemmOperand& a, const GemmOperand& b, float* c, int ldc,
          bool accumulate);
bool GemmBf16(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, float* c, int ldc,
              bool accumulate);
bool GemmBf16Out(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, uint16_t* c,
                 int ldc, bool relu);
#else
inline bool Available() { return false; }
inline bool NativeBf16() { return false; }
inline std::string EngineName(MatmulFormat) { return "none"; }
inline bool Gemm(int, int, int, const GemmOperand&, const GemmOperand&, float*, int, bool) {
  return false;
}
inline bool GemmBf16(int, int, int, const Bf16Operand&, const Bf16Operand&, float*, int, bool) {
  return false;
}
inline bool GemmBf16Out(int, int, int, const Bf16Operand&, const Bf16Operand&, uint16_t*, int,
                        bool) {
  return false;
}
#endif

}  // namespace gridsync::cpu::onednn
