// Loads libgorovod.so the way Python's ctypes does, with every symbol
// resolved at once (RTLD_NOW), and calls into it: a library that references a
// symbol no loaded library defines (NVML's, on a host without NVIDIA's
// software) fails here.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: %s libgorovod.so\n", argv[0]);
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 1;
	}
	int (*abi_version)(void);
	*(void **)(&abi_version) = dlsym(lib, "gorovod_abi_version");
	if (abi_version == NULL) {
		fprintf(stderr, "dlsym: %s\n", dlerror());
		return 1;
	}
	printf("LOADED abi %d\n", abi_version());
	return 0;
}
