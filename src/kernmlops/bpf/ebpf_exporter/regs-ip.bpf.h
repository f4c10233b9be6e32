/* SPDX-License-Identifier: GPL-2.0 */
/* KPROBE_REGS_IP_FIX for programs written for cloudflare/ebpf_exporter: a
 * kprobe sees the instruction pointer past the breakpoint it placed (one
 * kprobe_opcode_t on x86); this gives the probed function's address back. */
#ifndef KMO_EE_REGS_IP_BPF_H
#define KMO_EE_REGS_IP_BPF_H

#if defined(__TARGET_ARCH_x86)
#define KPROBE_REGS_IP_FIX(ip) ((ip) - sizeof(kprobe_opcode_t))
#else
#define KPROBE_REGS_IP_FIX(ip) (ip)
#endif

#endif /* KMO_EE_REGS_IP_BPF_H */
