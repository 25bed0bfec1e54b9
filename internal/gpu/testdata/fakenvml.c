// A stand-in for libnvidia-ml.so.1 with two GPUs, for nvml_cgo_test.go: it
// exports the functions discovery looks up, with NVML's signatures and struct
// layouts (memory {total, free, used}; PCI info with busId at byte 36), so
// the test checks the dlopen/dlsym path and the layouts the shim declares.
// Built with -DFAKE_OLD it lacks nvmlDeviceGetPciInfo_v3, as a too old
// driver would.
#include <stdio.h>
#include <string.h>

typedef struct {
	unsigned long long total, free, used;
} memory_t;
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} pci_t;

static int initialized;
static const char *bus[2] = {"00000000:1A:00.0", "00000000:1B:00.0"};
static int dev[2]; // device handles point here

static int index_of(void *d) { return d == &dev[0] ? 0 : d == &dev[1] ? 1 : -1; }

int nvmlInit_v2(void) { initialized++; return 0; }
int nvmlShutdown(void) { initialized--; return initialized < 0 ? 1 : 0; }
const char *nvmlErrorString(int r) { return r == 2 ? "Invalid Argument" : "fake error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return initialized > 0 ? 0 : 1; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) {
	if (i >= 2) return 2;
	*d = &dev[i];
	return 0;
}
int nvmlSystemGetDriverVersion(char *buf, unsigned int n) {
	if (n < 80) return 7; // NVML_ERROR_INSUFFICIENT_SIZE
	snprintf(buf, n, "550.54.15");
	return 0;
}
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 12040; return 0; }
int nvmlDeviceGetUUID(void *d, char *buf, unsigned int n) {
	if (n < 96 || index_of(d) < 0) return n < 96 ? 7 : 2;
	snprintf(buf, n, "GPU-fake-%d", index_of(d));
	return 0;
}
int nvmlDeviceGetName(void *d, char *buf, unsigned int n) { snprintf(buf, n, "Fake H100"); return 0; }
int nvmlDeviceGetMemoryInfo(void *d, memory_t *m) {
	m->total = 80ULL << 30;
	m->free = 1;
	m->used = 2;
	return 0;
}
#ifndef FAKE_OLD
int nvmlDeviceGetPciInfo_v3(void *d, pci_t *p) {
	memset(p, 0xff, sizeof *p); // garbage around the field read
	snprintf(p->busId, sizeof p->busId, "%s", bus[index_of(d)]);
	return 0;
}
#endif
int nvmlDeviceGetCudaComputeCapability(void *d, int *major, int *minor) { *major = 9; *minor = 0; return 0; }
int nvmlDeviceGetNvLinkState(void *d, unsigned int link, int *active) {
	if (link >= 4) return 2;
	*active = link < 2; // two active links, to the other GPU
	return 0;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void *d, unsigned int link, pci_t *p) {
	memset(p, 0xff, sizeof *p);
	snprintf(p->busId, sizeof p->busId, "%s", bus[1 - index_of(d)]);
	return 0;
}
int nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, int *level) { *level = 10; return 0; }
