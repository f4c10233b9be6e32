/* exporter set syscalls_comm: system calls by name and by the calling thread's
 * comm, failed ones by name, comm and errno (more series: enable on request). */
#define EXP_SYSCALLS_BY_COMM 1
#include "exp_syscalls.h"
