/* exporter set syscalls: system calls by name, failed ones by name and errno. */
#include "exp_syscalls.h"
