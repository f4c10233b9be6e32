// Test set in ebpf_exporter's format: an XDP program whose section names the
// interface it runs on (SEC("xdp/lo")), which libbpf alone does not know.
// Counts IPv4 UDP packets arriving on lo by destination port and passes them.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_P_IP 0x0800

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u64);
    __type(value, u64);
} test_xdp_udp_packets_total SEC(".maps");

SEC("xdp/lo")
int count_udp_on_lo(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + sizeof(*eth);
    struct udphdr *udp;
    u64 port, one = 1, *value;

    if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
        return XDP_PASS;
    if (ip->protocol != IPPROTO_UDP || ip->ihl != 5)
        return XDP_PASS;
    udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > data_end)
        return XDP_PASS;
    port = bpf_ntohs(udp->dest);
    value = bpf_map_lookup_elem(&test_xdp_udp_packets_total, &port);
    if (value)
        __sync_fetch_and_add(value, 1);
    else
        bpf_map_update_elem(&test_xdp_udp_packets_total, &port, &one, BPF_NOEXIST);
    return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
