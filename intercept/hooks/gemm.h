/* intercept/hooks/gemm.h - interposed cuBLAS / cuBLASLt GEMMs (docs/gemm.md):
 * signatures, operand capture and weight fingerprints. */
#ifndef PROBE_INTERCEPT_HOOKS_GEMM_H
#define PROBE_INTERCEPT_HOOKS_GEMM_H

struct shim_json;

/* Manifest section: ,"gemm":{...} when a GEMM was seen. */
void shim_gemm_json(struct shim_json *b);

#endif
