/* intercept/base/cudart.h - the few CUDA runtime types and constants the
 * shim uses, with the values of the runtime's own headers (CUDA 12 and 13:
 * cuda_runtime_api.h, driver_types.h). The shim never includes those
 * headers and never links the runtime: it calls the one the process loaded,
 * through pointers from base/resolve.h. */
#ifndef PROBE_INTERCEPT_BASE_CUDART_H
#define PROBE_INTERCEPT_BASE_CUDART_H

typedef int cudaError_t;
typedef int CUresult;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;

#define cudaSuccess 0
#define cudaErrorNotReady 600
#define cudaErrorUnknown 999
#define cudaStreamNonBlocking 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaMemcpyHostToDevice 1
#define cudaMemcpyDeviceToHost 2
#define cudaHostAllocPortable 0x01u
#define cudaStreamCaptureStatusNone 0
#define cudaStreamCaptureModeRelaxed 2

#endif
