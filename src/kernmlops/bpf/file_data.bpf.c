/* file_data: one row per file a process opens that has data or that the open
 * created (KernMLOps' file_data: which files a workload touches, their inode
 * and size at open).
 *
 * KernMLOps probes vfs_open / vfs_create with kprobes; without kprobes the
 * place every open(2) passes is the return of openat / openat2 (glibc's open,
 * creat and fopen all call openat): the returned fd is looked up in the
 * caller's fd table, which at that point holds the struct file just
 * installed. Not seen: the legacy open(2) / creat(2) syscalls called directly
 * and files opened by io_uring or inside the kernel (exec, module loading). */
#include "filter.h"

#define KMO_FILE_NAME_LEN 64
/* include/linux/fs.h: set by the open that created the file (a macro, so not
 * in BTF). */
#define KMO_FMODE_CREATED 0x100000

struct file_open_event {
	u64 ts_uptime_us;
	u64 file_inode;
	s64 file_size_bytes;
	u32 cpu;
	u32 pid;
	u32 tgid;
	u8 created; /* the open created the file */
	char file_name[KMO_FILE_NAME_LEN]; /* the last path component */
};

KMO_RING(file_open_rb, file_open_event);

static __always_inline int on_open_exit(long ret)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32, fd = (u32)ret;
	struct task_struct *task;
	struct file_open_event *e;
	struct fdtable *fdt;
	struct file **fds, *f = NULL;
	struct inode *inode;
	const unsigned char *name;
	bool created;
	s64 size;

	if (ret < 0 || !kmo_tgid_wanted(tgid))
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return 0;
	inode = BPF_CORE_READ(f, f_inode);
	if (!inode)
		return 0;
	size = BPF_CORE_READ(inode, i_size);
	created = BPF_CORE_READ(f, f_mode) & KMO_FMODE_CREATED;
	if (!created && size <= 0)
		return 0; /* as KernMLOps: only files with data, or new ones */
	e = KMO_RESERVE(file_open_rb, struct file_open_event, 0);
	if (!e)
		return 0;
	e->ts_uptime_us = kmo_uptime_us();
	e->file_inode = BPF_CORE_READ(inode, i_ino);
	e->file_size_bytes = size;
	e->cpu = bpf_get_smp_processor_id();
	e->pid = (u32)id;
	e->tgid = tgid;
	e->created = created;
	name = BPF_CORE_READ(f, f_path.dentry, d_name.name);
	if (bpf_probe_read_kernel_str(e->file_name, sizeof(e->file_name), name) < 0)
		e->file_name[0] = 0;
	KMO_SUBMIT(file_open_rb, e);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int openat_exit(struct syscall_trace_exit *ctx)
{
	return on_open_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_openat2")
int openat2_exit(struct syscall_trace_exit *ctx)
{
	return on_open_exit(ctx->ret);
}
