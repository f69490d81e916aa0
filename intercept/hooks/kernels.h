/* intercept/hooks/kernels.h - kernel-path evidence (docs/kernels.md): the
 * kernels launched inside each component, from the runtime's and the
 * driver's launch entry points. */
#ifndef PROBE_INTERCEPT_HOOKS_KERNELS_H
#define PROBE_INTERCEPT_HOOKS_KERNELS_H

struct shim_json;

/* Manifest section: ,"kernels":{...} (launch counts per component and
 * kernel name) when kernel logging is on in this process. */
void shim_kernels_json(struct shim_json *b);
/* 1 when this process has logged a kernel launch: its manifest will hold
 * them, so a child forked from it is not a fresh process. */
int shim_kernels_recorded(void);

#endif
