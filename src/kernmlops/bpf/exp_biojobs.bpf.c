/* exporter set biojobs: the biolatency set with the job in every key (the
 * submitter's cgroup v2 and process name), so one exporter watches several
 * jobs at once. Same programs, other maps: see exp_biolatency.bpf.c. */
#define EXP_BIO_JOBS 1
#include "exp_biolatency.bpf.c"
