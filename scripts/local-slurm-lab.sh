# local-slurm-lab.sh: the failure lab of scripts/local-slurm (sourced, not run).
#
# Every node nodeI of the local cluster is a separate "host":
#   - its own network namespace  $LAB_NAME-nodeI  (/run/netns), with one interface eth0
#     joined to the host bridge ${LAB_NAME}br0 by a veth pair (host end ${LAB_NAME}vI),
#     address $LAB_NET.(10+I)/24; the bridge holds $LAB_NET.1 (slurmctld, slurmdbd,
#     MariaDB listen there). No default route: a node reaches the lab /24 and nothing else.
#   - its own UTS namespace (hostname nodeI), entered by every process started on it;
#   - its own freezer cgroup ($LAB_NAME-lab/nodeI; cgroup v1 freezer, or v2 cgroup.freeze),
#     which its slurmd and therefore every slurmstepd and task inherit.
# Faults:
#   power-off  freeze the cgroup, then take the link down: peers see silence, no FIN/RST;
#   power-on   SIGKILL what was frozen, thaw, fresh namespace (a rebooted kernel), start slurmd;
#   partition  link down, every process keeps running; heal: link up;
#   kill-node  SIGKILL every process of the node: sockets close (a software crash);
#   throttle   a CPU quota on the node's cgroup (a throttled CPU: a gray, slow node);
#   slowlink   a token-bucket rate limit (tc tbf) on both ends of its link (a degraded link).
# Failure behaviour: each function dies with a clear message (die) when a kernel facility is
# missing or a command fails; nothing here touches any address outside $LAB_NET.0/24.

LAB_NAME=${TMSLURM_LAB_NAME:-tms}
LAB_NET=${TMSLURM_LAB_NET:-10.213.0}          # the lab's private /24 (first three octets)
LAB_CGROUP=${TMSLURM_LAB_CGROUP:-auto}        # auto | v1 | v2
SLURMD_PORT=${TMSLURM_SLURMD_PORT:-6818}      # every slurmd listens in its own namespace

lab_bridge() { echo "${LAB_NAME}br0"; }
lab_bridge_ip() { echo "$LAB_NET.1"; }
node_index() { echo "${1#node}"; }
node_addr() { echo "$LAB_NET.$((10 + $(node_index "$1")))"; }
node_netns() { echo "$LAB_NAME-$1"; }
node_netns_path() { echo "/run/netns/$(node_netns "$1")"; }
node_veth() { echo "${LAB_NAME}v$(node_index "$1")"; }
node_mac() { # locally administered, unique per lab address
    local a b c
    IFS=. read -r a b c <<<"$LAB_NET"
    printf '02:%02x:%02x:%02x:%02x:01\n' "$a" "$b" "$c" "$((10 + $(node_index "$1")))"
}
node_power_file() { echo "$RUN/power-$1"; }
node_throttle_file() { echo "$RUN/throttle-$1"; }
node_slowlink_file() { echo "$RUN/slowlink-$1"; }

lab_check_names() {
    [[ $LAB_NAME =~ ^[a-z][a-z0-9]{0,5}$ ]] ||
        die "TMSLURM_LAB_NAME='$LAB_NAME' must be 1-6 lower-case letters/digits starting with a letter (interface names are limited to 15 characters)"
    local o
    [[ $LAB_NET =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] ||
        die "TMSLURM_LAB_NET='$LAB_NET' must be the first three octets of a /24, e.g. 10.213.0"
    for o in "${BASH_REMATCH[@]:1}"; do (( o <= 255 )) || die "TMSLURM_LAB_NET='$LAB_NET': octet $o > 255"; done
    case $LAB_NET in
        10.* | 192.168.* | 172.1[6-9].* | 172.2[0-9].* | 172.3[01].*) ;;
        *) die "TMSLURM_LAB_NET='$LAB_NET' is not in a private range (10/8, 172.16/12, 192.168/16)" ;;
    esac
    (( NODES <= 240 )) || die "the lab /24 holds at most 240 nodes (asked for $NODES)"
}

# Refuse a /24 that any existing route (other than our own bridge) already covers.
lab_check_route() {
    local br net line
    br=$(lab_bridge); net="$LAB_NET.0/24"
    while read -r line; do
        [[ -z $line ]] && continue
        [[ $line == *" dev $br "* || $line == *" dev $br" ]] && continue
        die "the lab network $net collides with an existing route: '$line'
  choose another /24 with TMSLURM_LAB_NET (e.g. TMSLURM_LAB_NET=10.214.0)"
    done < <(ip -4 route show match "$LAB_NET.1" 2>/dev/null | grep -v '^default'; ip -4 route show root "$net" 2>/dev/null)
}

# ------------------------------------------------------------------------------- cgroups
lab_cgroup_kind() {
    case $LAB_CGROUP in
        v1) [[ -e /sys/fs/cgroup/freezer/cgroup.procs ]] || die "TMSLURM_LAB_CGROUP=v1 but no cgroup v1 freezer is mounted at /sys/fs/cgroup/freezer"; echo v1 ;;
        v2) [[ -n $(lab_v2_root) ]] || die "TMSLURM_LAB_CGROUP=v2 but no cgroup2 hierarchy is mounted"; echo v2 ;;
        auto)
            if [[ -e /sys/fs/cgroup/freezer/cgroup.procs ]]; then echo v1
            elif [[ -n $(lab_v2_root) ]]; then echo v2
            else die "no freezer: neither cgroup v1 freezer (/sys/fs/cgroup/freezer) nor cgroup v2 is mounted"; fi ;;
        *) die "TMSLURM_LAB_CGROUP='$LAB_CGROUP' must be auto, v1 or v2" ;;
    esac
}

lab_v2_root() { # the cgroup2 mount (pure v2: /sys/fs/cgroup; hybrid: /sys/fs/cgroup/unified)
    awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts
}

lab_cgroup_root() {
    if [[ $(lab_cgroup_kind) == v1 ]]; then echo "/sys/fs/cgroup/freezer/$LAB_NAME-lab"
    else echo "$(lab_v2_root)/$LAB_NAME-lab"; fi
}
node_cgroup() { echo "$(lab_cgroup_root)/$1"; }

node_cgroup_procs() { # pids in NODE's cgroup
    local f; f="$(node_cgroup "$1")/cgroup.procs"
    [[ -r $f ]] && cat "$f"
    return 0
}

cgroup_set_frozen() { # NODE 1|0 ; waits until the kernel reports the state
    cgroup_request_frozen "$1" "$2"
    cgroup_wait_frozen "$1" "$2"
}

cgroup_request_frozen() { # NODE 1|0 ; asks the kernel, returns at once (several nodes freeze together)
    local cg; cg=$(node_cgroup "$1")
    [[ -d $cg ]] || die "no cgroup $cg for $1 (is the lab up?)"
    if [[ $(lab_cgroup_kind) == v1 ]]; then
        echo "$([[ $2 == 1 ]] && echo FROZEN || echo THAWED)" >"$cg/freezer.state"
    else
        echo "$2" >"$cg/cgroup.freeze"
    fi
}

cgroup_wait_frozen() { # NODE 1|0 ; waits up to 5 s until the kernel reports the state
    local cg i want
    cg=$(node_cgroup "$1")
    if [[ $(lab_cgroup_kind) == v1 ]]; then
        want=$([[ $2 == 1 ]] && echo FROZEN || echo THAWED)
        for ((i = 0; i < 100; i++)); do
            [[ $(cat "$cg/freezer.state") == "$want" ]] && return 0
            sleep 0.05
        done
    else
        for ((i = 0; i < 100; i++)); do
            grep -qx "frozen $2" "$cg/cgroup.events" && return 0
            sleep 0.05
        done
    fi
    die "$1: cgroup did not become $([[ $2 == 1 ]] && echo frozen || echo thawed) within 5 s"
}

node_frozen() { # NODE -> 0 when frozen
    local cg; cg=$(node_cgroup "$1")
    if [[ $(lab_cgroup_kind) == v1 ]]; then [[ $(cat "$cg/freezer.state" 2>/dev/null) == FROZEN ]]
    else grep -qx "frozen 1" "$cg/cgroup.events" 2>/dev/null; fi
}

lab_cgroups_up() {
    local root n cpu
    root=$(lab_cgroup_root)
    mkdir -p "$root" || die "cannot create cgroup $root"
    for n in $(node_names); do mkdir -p "$root/$n" || die "cannot create cgroup $root/$n"; done
    cpu=$(lab_cpu_v1_root)
    if [[ -n $cpu ]]; then
        for n in $(node_names); do mkdir -p "$cpu/$n" || die "cannot create cgroup $cpu/$n"; done
    fi
}

# ------------------------------------------------------------------ CPU quota (throttle)
# cgroup v1: the cpu hierarchy holds a $LAB_NAME-lab/nodeI cgroup next to the freezer's, which
# in_node enters too (so every process of the node inherits it); v2: the node's one cgroup, with
# the cpu controller enabled above it. The quota is in percent of one CPU.
lab_cpu_v1_root() { # the v1 cpu hierarchy's lab cgroup, or nothing when v1 has no cpu controller
    local d
    for d in /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
        [[ -e $d/cgroup.procs && -e $d/cpu.cfs_quota_us ]] && { echo "$d/$LAB_NAME-lab"; return 0; }
    done
    return 0
}

node_cpu_quota() { # NODE PCT|off
    local node=$1 pct=$2 period=100000 v1 cg pid ctl
    v1=$(lab_cpu_v1_root)
    if [[ -n $v1 ]]; then
        cg="$v1/$node"
        mkdir -p "$cg" || die "cannot create cgroup $cg"
        # processes started before this lab knew about cpu cgroups: move them (children inherit)
        while read -r pid; do echo "$pid" >"$cg/cgroup.procs" 2>/dev/null || true; done < <(node_cgroup_procs "$node")
        if [[ $pct == off ]]; then
            echo -1 >"$cg/cpu.cfs_quota_us" || die "cannot clear the CPU quota of $node"
        else
            echo "$period" >"$cg/cpu.cfs_period_us" && echo $((pct * period / 100)) >"$cg/cpu.cfs_quota_us" ||
                die "cannot set the CPU quota of $node"
        fi
        return 0
    fi
    [[ $(lab_cgroup_kind) == v2 ]] || die "no cpu controller: cgroup v1 has no cpu hierarchy and the lab's cgroups are not v2"
    cg=$(node_cgroup "$node")
    for ctl in "$(lab_v2_root)/cgroup.subtree_control" "$(lab_cgroup_root)/cgroup.subtree_control"; do
        grep -qw cpu "$ctl" || echo +cpu >"$ctl" || die "cannot enable the cpu controller in $ctl"
    done
    if [[ $pct == off ]]; then echo "max $period" >"$cg/cpu.max" || die "cannot clear the CPU quota of $node"
    else echo "$((pct * period / 100)) $period" >"$cg/cpu.max" || die "cannot set the CPU quota of $node"; fi
}

# ------------------------------------------------------------------ link rate (slowlink)
# A token bucket (tc tbf) on both ends of the node's veth: what the node sends and what it
# receives both pass at RATE at most (netem is not available here).
node_link_rate() { # NODE RATE|off
    local node=$1 rate=$2 veth ns
    veth=$(node_veth "$node"); ns=$(node_netns_path "$node")
    if [[ $rate == off ]]; then
        tc qdisc del dev "$veth" root 2>/dev/null || true
        nsenter --net="$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        return 0
    fi
    tc qdisc replace dev "$veth" root tbf rate "$rate" burst 256kb latency 200ms ||
        die "cannot limit the link of $node (tc tbf on $veth)"
    nsenter --net="$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 200ms ||
        die "cannot limit the link of $node (tc tbf on its eth0)"
}

lab_cgroups_down() {
    local root n cpu
    cpu=$(lab_cpu_v1_root)
    if [[ -n $cpu && -d $cpu ]]; then
        for n in "$cpu"/*/; do [[ -d $n ]] && rmdir "$n" 2>/dev/null; done
        rmdir "$cpu" 2>/dev/null || warn "cannot remove cgroup $cpu (processes left in it?)"
    fi
    root=$(lab_cgroup_root)
    [[ -d $root ]] || return 0
    for n in "$root"/*/; do
        [[ -d $n ]] && rmdir "$n" 2>/dev/null
    done
    rmdir "$root" 2>/dev/null || warn "cannot remove cgroup $root (processes left in it?)"
}

# -------------------------------------------------------------------------------- network
lab_bridge_up() {
    local br ip
    br=$(lab_bridge); ip=$(lab_bridge_ip)
    if ! ip link show "$br" >/dev/null 2>&1; then
        lab_check_route
        ip link add "$br" type bridge || die "cannot create bridge $br"
        ip addr add "$ip/24" dev "$br" || die "cannot give $br the address $ip/24"
    fi
    ip link set "$br" up || die "cannot bring $br up"
}

# node_net_up NODE: namespace, veth pair on the bridge, addresses, links up
node_net_up() {
    local node=$1 ns veth addr
    ns=$(node_netns "$node"); veth=$(node_veth "$node"); addr=$(node_addr "$node")
    if [[ ! -e /run/netns/$ns ]]; then
        ip netns add "$ns" || die "cannot create network namespace $ns"
    fi
    if ! ip link show "$veth" >/dev/null 2>&1; then
        # a fixed MAC per node: a rebooted node keeps its NIC, so peers' ARP entries stay valid
        ip link add "$veth" type veth peer name eth0 address "$(node_mac "$node")" netns "$ns" ||
            die "cannot create veth $veth for $node"
        ip link set "$veth" master "$(lab_bridge)" || die "cannot attach $veth to $(lab_bridge)"
        nsenter --net="/run/netns/$ns" ip addr add "$addr/24" dev eth0 || die "cannot address eth0 of $node"
    fi
    nsenter --net="/run/netns/$ns" ip link set lo up
    nsenter --net="/run/netns/$ns" ip link set eth0 up
    ip link set "$veth" up || die "cannot bring $veth up"
}

node_net_down() { # remove NODE's veth and namespace
    local ns veth
    ns=$(node_netns "$1"); veth=$(node_veth "$1")
    ip link del "$veth" 2>/dev/null || true
    [[ -e /run/netns/$ns ]] && { ip netns del "$ns" 2>/dev/null || warn "cannot delete namespace $ns"; }
    return 0
}

node_link() { # NODE up|down (the host end of its veth: the node's only link)
    ip link set "$(node_veth "$1")" "$2" || die "cannot set the link of $1 $2"
}

node_link_state() { # NODE -> up | down | missing
    local out
    out=$(ip -o link show "$(node_veth "$1")" 2>/dev/null) || { echo missing; return 0; }
    [[ $out == *"<"*",UP"* || $out == *"<UP"* ]] && echo up || echo down
}

lab_net_down() {
    local n
    for n in $(node_names); do node_net_down "$n"; done
    ip link del "$(lab_bridge)" 2>/dev/null || true
}

# Handles on the host's own namespaces (bind mounts, like ip netns does), so that a fault
# command started on a node can act from the host (/proc/1/ns may not be readable).
lab_host_ns() { echo "$RUN/host-$1.ns"; }

lab_host_ns_up() {
    local kind f
    for kind in net uts; do
        f=$(lab_host_ns "$kind")
        mountpoint -q "$f" 2>/dev/null && continue
        touch "$f" && mount --bind "/proc/$BASHPID/ns/$kind" "$f" || die "cannot keep a handle on the host's $kind namespace"
    done
}

lab_host_ns_down() {
    local kind f
    for kind in net uts; do
        f=$(lab_host_ns "$kind")
        mountpoint -q "$f" 2>/dev/null && umount "$f"
        rm -f "$f"
    done
    return 0
}

lab_up() {
    lab_check_names
    lab_cgroup_kind >/dev/null
    mkdir -p "$RUN"
    lab_host_ns_up
    lab_bridge_up
    local n
    for n in $(node_names); do node_net_up "$n"; done
    lab_cgroups_up
}

lab_down() {
    local n
    for n in $(node_names); do
        # a powered-off node's processes are frozen: thaw so that they can die
        [[ -d $(node_cgroup "$n") ]] && { kill_cgroup "$n" >/dev/null; rm -f "$(node_power_file "$n")"; }
        rm -f "$(node_throttle_file "$n")" "$(node_slowlink_file "$n")"
    done
    lab_net_down
    lab_cgroups_down
    lab_host_ns_down
}

# ------------------------------------------------------------------------------ processes
# in_node NODE CMD...: exec CMD on NODE (its cgroup, network and UTS namespaces, hostname).
in_node() {
    local node=$1; shift
    echo "$BASHPID" >"$(node_cgroup "$node")/cgroup.procs" || die "cannot enter the cgroup of $node"
    local cpu; cpu=$(lab_cpu_v1_root)
    [[ -z $cpu ]] || echo "$BASHPID" >"$cpu/$node/cgroup.procs" || die "cannot enter the cpu cgroup of $node"
    exec nsenter --net="$(node_netns_path "$node")" -- unshare --uts -- \
        /bin/sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
}

# kill_cgroup NODE: SIGKILL every process of NODE; prints how many there were.
kill_cgroup() {
    local node=$1 pids=() was_frozen=0 i
    node_frozen "$node" && was_frozen=1
    (( was_frozen )) || cgroup_set_frozen "$node" 1   # nothing forks away while we kill
    mapfile -t pids < <(node_cgroup_procs "$node")
    (( ${#pids[@]} )) && kill -KILL "${pids[@]}" 2>/dev/null
    cgroup_set_frozen "$node" 0                       # a frozen task dies only once thawed
    for ((i = 0; i < 100; i++)); do
        [[ -z $(node_cgroup_procs "$node") ]] && break
        sleep 0.05
    done
    [[ -z $(node_cgroup_procs "$node") ]] || warn "$node: processes survive SIGKILL: $(node_cgroup_procs "$node" | tr '\n' ' ')"
    echo "${#pids[@]}"
}

node_power() { # NODE -> on | off | partitioned
    local f; f=$(node_power_file "$1")
    [[ -r $f ]] && cat "$f" || echo on
}

node_link_state_bridge() {
    ip link show "$(lab_bridge)" >/dev/null 2>&1 && echo present || echo missing
}
