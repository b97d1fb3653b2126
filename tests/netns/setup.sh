# Namespaces A (client), B (server), C (attacker), each joined to the host by a veth pair, routed
# through the host (ip_forward=1). Sourced by run.sh; `netns_down` removes everything.
P=colot$$                      # name prefix: unique per run
NS_A=${P}a NS_B=${P}b NS_C=${P}c
IP_A=10.231.1.2 IP_B=10.231.2.2 IP_C=10.231.3.2 VIP=10.231.99.10
FWD_WAS=$(cat /proc/sys/net/ipv4/ip_forward)

ipt() { iptables -w "$@"; }

netns_up() {
    local i=1 n
    for n in $NS_A $NS_B $NS_C; do
        ip netns add "$n"
        ip link add "${P}h$i" type veth peer name eth0 netns "$n"
        ip addr add "10.231.$i.1/24" dev "${P}h$i"
        ip link set "${P}h$i" up
        ip -n "$n" addr add "10.231.$i.2/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" link set lo up
        ip -n "$n" route add default via "10.231.$i.1"
        i=$((i + 1))
    done
    echo 1 > /proc/sys/net/ipv4/ip_forward
    ipt -I FORWARD -s 10.231.0.0/16 -d 10.231.0.0/16 -j ACCEPT -m comment --comment "$P"
    # A Service VIP: VIP:80 is B's port 6379 (kube-proxy style DNAT).
    ipt -t nat -A PREROUTING -d $VIP -p tcp --dport 80 -j DNAT --to-destination $IP_B:6379 -m comment --comment "$P"
}

# Deletes every rule tagged with this run's comment.
drop_rules() {
    local t rule
    for t in filter nat; do
        ipt -t $t -S | grep -- "--comment $P" | sed 's/^-A/-D/' | while read -r rule; do
            eval "ipt -t $t $rule" || true
        done
    done
}

# Two more pairs of namespaces, X1-Y1 and X2-Y2, each joined by a veth pair of its own with the
# same addresses in both pairs (X 10.232.0.1, Y 10.232.0.2): overlapping pod networks.
NS_X1=${P}x1 NS_Y1=${P}y1 NS_X2=${P}x2 NS_Y2=${P}y2
IP_X=10.232.0.1 IP_Y=10.232.0.2
pairs_up() {
    local k x y
    for k in 1 2; do
        x=${P}x$k y=${P}y$k
        ip netns add "$x" && ip netns add "$y" || return 1
        ip link add eth0 netns "$x" type veth peer name eth0 netns "$y" || return 1
        ip -n "$x" addr add $IP_X/24 dev eth0
        ip -n "$y" addr add $IP_Y/24 dev eth0
        for n in "$x" "$y"; do ip -n "$n" link set eth0 up; ip -n "$n" link set lo up; done
    done
}

netns_down() {
    drop_rules
    local i
    for n in $NS_A $NS_B $NS_C $NS_X1 $NS_Y1 $NS_X2 $NS_Y2; do ip netns del "$n" 2>/dev/null || true; done
    for i in 1 2 3; do ip link del "${P}h$i" 2>/dev/null || true; done
    echo "$FWD_WAS" > /proc/sys/net/ipv4/ip_forward
}
