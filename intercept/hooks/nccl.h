/* intercept/hooks/nccl.h - interposed NCCL collectives (docs/nccl.md):
 * counts per component and collective, operand capture. */
#ifndef PROBE_INTERCEPT_HOOKS_NCCL_H
#define PROBE_INTERCEPT_HOOKS_NCCL_H

struct shim_json;

/* Manifest section: ,"nccl":{rank, nranks, per component and collective
 * counts and bytes} when NCCL was called. */
void shim_nccl_json(struct shim_json *b);

#endif
