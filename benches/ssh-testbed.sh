#!/bin/bash
# benches/ssh-testbed.sh (docs/benchmarks.md, "Issue 45: the 16-core sshd
# testbed"): overlay's relay, --direct and local route against rsync and
# tar|zstd over real OpenSSH, on one many-core host with no sshd of its own
# (the device). Two sshds on loopback play the source host (127.0.0.2) and
# the target host (127.0.0.3); this script is the controller. Both hosts
# share this machine's filesystem, so the source venv is the real venv and
# the target a copy of it without the stack (torch, triton, the nvidia
# wheels, torchvision), which every method then adds.
#
# Run as root:
#
#   OVERLAY_BIN=overlay [BASE_BIN=overlay-before] SSHDIR=.dev/ssh OUT=dir \
#     [REPS=2] [VARIANTS="--connections 4;--connections 8"] [EXTRA=ARGS] \
#     [VENV=/path/to/venv] [CACHE=cold|warm|none] [RAW_MB=4096] [ONLY="relay rsync-aes"] \
#     bash benches/ssh-testbed.sh
#
#   OVERLAY_BIN  static overlay binary (the build measured)
#   BASE_BIN     the build before: its relay, --direct and local route run
#                too, interleaved ("relay-base", ...), in the same run
#   SSHDIR       OpenSSH, rsync and zstd made by benches/ssh-carry.sh
#                (default .dev/ssh); used through its bin/ wrappers only
#   VARIANTS     ";"-separated apply arguments, each measured as methods of
#                its own for the relay and --direct (OVERLAY_BIN only):
#                "--connections 4" gives relay+connections4 and
#                direct+connections4; "default" entries are skipped (the
#                plain relay and direct always run)
#   EXTRA        arguments added to every apply of OVERLAY_BIN
#   STACK        torch (the only stack so far): what is removed from the target
#   VENV         the source venv (default: the venv of the `python3` on PATH)
#   CACHE        the page cache before every timed run, after `sync`:
#                warm (the default) reads the source stack (16 readers), so
#                that all of it is in the page cache, as in the issue's
#                table ("source in the page cache"; the target's pages went
#                with the reset's rm -rf, its dirty ones with the sync):
#                the connections and the CPU are measured, not the disk;
#                cold drops the page cache (echo 3 > drop_caches): the
#                storage's cold reads are in every figure; none: only sync
#   RAW_MB       the raw check's size: RAW_MB MiB of zeros through 1, 4
#                and 8 aes128-gcm connections at once (0: skip)
#   ONLY         time only these methods
#   VERIFY       1 (the default): after the first run of each overlay
#                method of OVERLAY_BIN (relay, direct, local, the variants),
#                check the target's stack is the source's (sha256 of every
#                file but bytecode, modes, symlinks); all: after the first
#                run of every method (BASE_BIN's, rsync, tar-zstd too); 0: skip
#   FANOUT       1: a second target host (dst2, 127.0.0.4, its own copy of
#                the target venv) and the fan-out methods: "fanout", one
#                `overlay apply` of the plan of both targets (one read of
#                the source, streamed to both; --connections auto), and
#                "fanout+connections1" (the same over one connection, the
#                stream before the fan-out took lanes); both targets are
#                reset before every run, and checked after the first
#   PORT         the sshds' port on all addresses (default 22022)
#   WORK         scratch folder (default /tmp/ssh-testbed); the target venv
#                is kept there and reused by the next run (KEEP=0 removes it at the end)
#   ISOLATE      1: run in a private mount namespace with a scratch folder
#                over root's home, so that ~/.ssh and ~/.cache/overlay of
#                the real home are not touched (for a test on a shared
#                machine; VENV, its interpreter and WORK must lie outside the home).
#                HIDE_SYSTEM=1 with it: this machine's own sshd, ssh, rsync,
#                zstd, sftp-server and ssh-keygen are hidden in that
#                namespace, as on the device, so only the carried ones can run
#
# Methods (each timed with a final `sync`, as overlay makes its files
# durable itself; the target reset and the settled page cache before each):
#   relay      overlay apply (controller -> 127.0.0.2 -> controller -> 127.0.0.3)
#   direct     overlay apply --direct (127.0.0.2's ssh -> 127.0.0.3)
#   local      overlay apply of both venvs as local hosts: the storage's floor
#   rsync      on the source host: rsync -aW of the stack's folders to the target (default cipher)
#   rsync-aes  the same with -e 'ssh -c aes128-gcm@openssh.com'
#   tar-zstd   on the source host: tar | zstd -1 -T0 | ssh -c aes128-gcm target 'zstd -d | tar -x'
# Output: "TIME method rep seconds" per run (a failed one: "FAIL ..."), a
# medians table and ratios; in OUT: every run's stdout/stderr
# (METHOD-REP.{out,err}), overlay's "stream waits" lines (waits.txt),
# the raw check (raw.txt), the correctness check (verify-*.txt), the
# environment (env.txt) and the summary (summary.txt).
set -u
export LC_ALL=C

# ---------------------------------------------------------------------------
# Settings

die() { echo "ssh-testbed: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (sshd, /run/sshd, drop_caches)"
[ -n "${OVERLAY_BIN:-}" ] || die "OVERLAY_BIN is not set"
BIN=$(realpath "$OVERLAY_BIN") || die "no $OVERLAY_BIN"
BASE=""; [ -z "${BASE_BIN:-}" ] || BASE=$(realpath "$BASE_BIN") || die "no $BASE_BIN"
SSHDIR=$(realpath "${SSHDIR:-.dev/ssh}") || die "no SSHDIR (make it with benches/ssh-carry.sh)"
OUT=${OUT:-/tmp/ssh-testbed-out}
REPS=${REPS:-2}
VARIANTS=${VARIANTS:-}
STACK=${STACK:-torch}
CACHE=${CACHE:-warm}
RAW_MB=${RAW_MB:-4096}
VERIFY=${VERIFY:-1}
PORT=${PORT:-22022}
W=${WORK:-/tmp/ssh-testbed}
SRC_IP=127.0.0.2
DST_IP=127.0.0.3
DST2_IP=127.0.0.4
FANOUT=${FANOUT:-0}
AES=aes128-gcm@openssh.com
ROOTHOME=$(getent passwd root | cut -d: -f6)
case $CACHE in cold|warm|none) ;; *) die "CACHE must be cold, warm or none" ;; esac
for t in sshd ssh sftp-server ssh-keygen rsync zstd; do
  [ -x "$SSHDIR/bin/$t" ] || die "$SSHDIR/bin/$t is missing: run benches/ssh-carry.sh $SSHDIR on a Debian 12 machine"
done
# Each carried tool must load here with the carried libraries and this
# host's glibc: say which library is missing rather than have sshd die.
for t in "$SSHDIR"/libexec/*; do
  nf=$(LD_LIBRARY_PATH="$SSHDIR/lib" ldd "$t" 2>&1 | grep "not found")
  [ -z "$nf" ] || die "$t cannot load here: $(echo $nf)"
done
chmod +x "$BIN" ${BASE:+"$BASE"}
mkdir -p "$OUT" "$W"
OUT=$(realpath "$OUT"); W=$(realpath "$W")

# ISOLATE=1: everything below in a private mount namespace whose root home
# is a scratch folder (the sshds started below live in it too).
if [ "${ISOLATE:-0}" = 1 ] && [ -z "${TESTBED_ISOLATED:-}" ]; then
  case $W/ in "$ROOTHOME"/*) die "ISOLATE=1 needs WORK outside $ROOTHOME" ;; esac
  export TESTBED_ISOLATED=1
  exec unshare --mount --propagation private bash "$0" "$@"
fi
if [ -n "${TESTBED_ISOLATED:-}" ]; then
  mkdir -p "$W/home"; chmod 700 "$W/home"
  mount --bind "$W/home" "$ROOTHOME" || die "cannot mount a scratch home over $ROOTHOME"
  if [ "${HIDE_SYSTEM:-0}" = 1 ]; then
    for f in /usr/sbin/sshd /usr/bin/ssh /usr/bin/rsync /usr/bin/zstd /usr/lib/openssh/sftp-server /usr/bin/ssh-keygen; do
      [ ! -e "$f" ] || mount --bind /dev/null "$f" || die "cannot hide $f"
    done
  fi
fi

# The controller (overlay, ssh) and the hosts' sessions find the carried
# tools first; overlay reads ~/.ssh from HOME, OpenSSH from the password
# database: both are root's home.
export PATH="$SSHDIR/bin:$PATH" HOME=$ROOTHOME
unset SSH_AUTH_SOCK

VENV=${VENV:-$(python3 -c 'import sys;print(sys.prefix)')}
VENV=$(realpath "$VENV")
SITES=("$VENV"/lib/python3*/site-packages)
[ ${#SITES[@]} = 1 ] && [ -d "${SITES[0]}" ] || die "$VENV has no single lib/python3*/site-packages"
SITE=${SITES[0]}
REL=${SITE#"$VENV"/}            # lib/python3.X/site-packages
# The target venv, its site-packages and the folder with its pristine
# listings; use_target 2 switches them to the second target (FANOUT=1).
use_target() { # use_target 1|2
  TW=$W/target; [ "$1" = 1 ] || TW=$W/target$1
  T=$TW/venv; TSITE=$T/$REL
}
use_target 1

# The stack: top-level names in site-packages.
case $STACK in
  torch) GLOBS="torch torch-*.dist-info torchvision torchvision-*.dist-info torchvision.libs
                triton triton-*.dist-info nvidia nvidia_*.dist-info functorch torchgen" ;;
  *) die "STACK=$STACK: only torch is known" ;;
esac
STACK_NAMES=$(cd "$SITE" && ls -d $GLOBS 2>/dev/null | sort)
[ -n "$STACK_NAMES" ] || die "no stack ($GLOBS) in $SITE"
# The distributions those are: the names of their dist-info folders.
STACK_DISTS=$(for d in $STACK_NAMES; do
  case $d in *.dist-info) echo "${d%%-*}" ;; esac; done | sort -u)

# ---------------------------------------------------------------------------
# Clean-up: stop the sshds, give root's ~/.ssh back.

SSHD_PIDS=()
SSH_BACKUP=""
cleanup() {
  local p
  for p in "${SSHD_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${SSHD_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  if [ -z "${TESTBED_ISOLATED:-}" ] && [ -n "$SSH_BACKUP" ]; then
    rm -rf "$ROOTHOME/.ssh"
    [ "$SSH_BACKUP" = none ] || mv "$SSH_BACKUP" "$ROOTHOME/.ssh"
  fi
  [ "${KEEP:-1}" = 1 ] || rm -rf "$W/target" "$W/target2"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------
# The two hosts

setup_sshd_account() {
  # Debian's sshd drops privileges to user `sshd` in /run/sshd (its
  # privilege separation); Ubuntu without openssh-server has neither.
  if ! getent passwd sshd > /dev/null; then
    useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd 2>/dev/null ||
      echo "sshd:x:$(( 900 + RANDOM % 50 )):65534::/run/sshd:/usr/sbin/nologin" >> /etc/passwd
  fi
  mkdir -p /run/sshd; chmod 755 /run/sshd
}

setup_client() {
  # root's ~/.ssh: kept aside and given back at exit (not under ISOLATE,
  # where it is the scratch home's). The same folder serves the controller
  # and the source host's own ssh (--direct, rsync, tar|zstd): one home.
  local s=$ROOTHOME/.ssh
  # A run killed before its trap left its ~/.ssh (marked): remove it and
  # put back the one it had kept aside.
  if [ -e "$s/.ssh-testbed" ]; then
    rm -rf "$s"
    [ ! -e "$W/dot-ssh.orig" ] || mv "$W/dot-ssh.orig" "$s"
  fi
  if [ -z "${TESTBED_ISOLATED:-}" ]; then
    if [ -e "$s" ]; then
      SSH_BACKUP=$W/dot-ssh.orig; rm -rf "$SSH_BACKUP"; mv "$ROOTHOME/.ssh" "$SSH_BACKUP"
    else
      SSH_BACKUP=none
    fi
  fi
  rm -rf "$s"   # under ISOLATE: the scratch home's, from an earlier run
  mkdir -p "$s"; chmod 700 "$s"; touch "$s/.ssh-testbed"
  ssh-keygen -q -t ed25519 -N "" -C ssh-testbed -f "$s/id_ed25519"
  # The sessions' PATH (sshd reads it with PermitUserEnvironment): the
  # remote rsync, zstd and the source's ssh are the carried wrappers,
  # which set LD_LIBRARY_PATH for themselves only.
  echo "PATH=$SSHDIR/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" > "$s/environment"
  : > "$s/config"; : > "$s/known_hosts"
}

start_host() { # start_host NAME IP: an sshd on IP:PORT, named NAME in ~/.ssh/config
  local name=$1 ip=$2 h=$W/hosts/$1
  # An sshd a killed run left (a command's time limit kills without the
  # trap) would hold the port: stop it, if it is that run's.
  local old; old=$(cat "$h/sshd.pid" 2>/dev/null)
  if [ -n "$old" ] && tr '\0' ' ' < "/proc/$old/cmdline" 2>/dev/null | grep -qF "$h/sshd_config"; then
    echo "stopping the sshd of an earlier run (pid $old)"; kill "$old"; sleep 0.5
  fi
  rm -rf "$h"; mkdir -p "$h"
  ssh-keygen -q -t ed25519 -N "" -C "ssh-testbed-$name" -f "$h/host_key"
  cp "$ROOTHOME/.ssh/id_ed25519.pub" "$h/authorized_keys"
  cat > "$h/sshd_config" <<EOF
ListenAddress $ip
Port $PORT
HostKey $h/host_key
PidFile $h/sshd.pid
AuthorizedKeysFile $h/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
PermitUserEnvironment yes
MaxSessions 256
MaxStartups 256:30:512
Subsystem sftp $SSHDIR/bin/sftp-server
LogLevel ERROR
EOF
  # -D: stays in the foreground, so its pid is ours to stop.
  setsid "$SSHDIR/bin/sshd" -D -e -f "$h/sshd_config" < /dev/null >> "$h/sshd.log" 2>&1 &
  SSHD_PIDS+=($!)
  cat >> "$ROOTHOME/.ssh/config" <<EOF
Host $name
    HostName $ip
    Port $PORT
    User root
    IdentityFile $ROOTHOME/.ssh/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $ROOTHOME/.ssh/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
EOF
  echo "[$ip]:$PORT $(cut -d' ' -f1,2 "$h/host_key.pub")" >> "$ROOTHOME/.ssh/known_hosts"
  local i
  for i in $(seq 100); do
    ssh "$name" true 2> "$h/probe.err" && return 0
    sleep 0.1
  done
  die "host $name ($ip:$PORT) does not answer: $(tail -3 "$h/probe.err"; tail -5 "$h/sshd.log")"
}

# ---------------------------------------------------------------------------
# The target venv and its reset

# A listing that any change of the target shows in: every entry's type and
# path, and for files and links their size, mode and mtime (a folder's
# mtime changes with its entries, which the paths already show).
listing() { (cd "$T" && find . \( -type d -printf '%y %p\n' \) -o -printf '%y %p %s %m %T@\n' | sort); }
paths() { (cd "$T" && find . | sort); }

make_target() {
  # Made once (a copy of the source venv without the stack) and kept in
  # WORK for the next run of the same venv: a cp -a of the whole venv is
  # the slowest step of the set-up.
  if [ -f "$TW/ready" ] && [ "$(cat "$TW/ready")" = "$VENV $STACK_NAMES" ]; then
    echo "target: reusing $T"
    reset_target
    return
  fi
  rm -rf "$TW"; mkdir -p "$T"
  # tar rather than cp -a and rm: the stack (GBs) is never written.
  local ex=() n
  for n in $STACK_NAMES; do ex+=("--exclude=./$REL/$n"); done
  tar -C "$VENV" --anchored "${ex[@]}" -cf - . | tar -C "$T" -xf - || die "copying $VENV to $T failed"
  (cd "$TSITE" && rm -rf $STACK_NAMES)     # nothing, unless tar's exclusion missed one
  cp -a "$T/bin" "$TW/bin.pristine"
  paths > "$TW/pristine.paths"
  listing > "$TW/pristine.lst"
  echo "$VENV $STACK_NAMES" > "$TW/ready"
  echo "target: $T made"
}

reset_target_quick() {
  # Undo what any method wrote: overlay's state folder (generations, the
  # backup, the lock), the stack, every other entry the pristine copy has
  # not (new console scripts, bytecode), and bin/, whose scripts an apply
  # may rewrite (shebangs).
  rm -rf "$T/.overlay"
  (cd "$TSITE" && rm -rf $STACK_NAMES)
  paths | comm -13 "$TW/pristine.paths" - | (cd "$T" && xargs -r -d '\n' rm -rf)
  rm -rf "$T/bin"; cp -a "$TW/bin.pristine" "$T/bin"
}

reset_target() {
  # rm -rf of what was added is faster than a fresh copy, and the listing
  # proves it exact; if it is not, the target is made again.
  reset_target_quick
  if ! listing | cmp -s - "$TW/pristine.lst"; then
    echo "  target reset was not exact ($(listing | diff - "$TW/pristine.lst" | grep -c '^[<>]') lines differ): copying it again"
    rm -f "$TW/ready"; make_target
  fi
}

# Every target of the run: reset_target or make_target of each.
each_target() { # each_target FUNCTION
  "$1"
  if [ "$FANOUT" = 1 ]; then use_target 2; "$1"; use_target 1; fi
}

# ---------------------------------------------------------------------------
# The manifest and the methods

write_manifest() {
  mkdir -p "$W/ctl"
  local dists; dists=$(printf '"%s", ' $STACK_DISTS); dists=${dists%, }
  cat > "$W/ctl/overlay.toml" <<EOF
# written by benches/ssh-testbed.sh
[hosts.src]
ssh = "src"
venv = "$VENV"
[hosts.dst]
ssh = "dst"
venv = "$T"
[hosts.lsrc]
venv = "$VENV"
[hosts.ldst]
venv = "$T"
[hosts.dst2]
ssh = "dst2"
venv = "$W/target2/venv"
[sets.stack]
dists = [$dists]
EOF
}

q() { printf '%q' "$1"; }
STACK_Q=$(for n in $STACK_NAMES; do printf '%q ' "$n"; done)

# The commands the non-overlay methods run on the source host, as a user
# there would type them (the remote rsync and zstd are found on the
# session's PATH).
rsync_cmd() { # rsync_cmd [SSH-ARGS]
  local e=""; [ -z "${1:-}" ] || e="-e $(q "ssh $1")"
  echo "cd $(q "$SITE") && rsync -aW $e $STACK_Q dst:$(q "$TSITE")/"
}
tar_cmd() {
  echo "cd $(q "$SITE") && tar -cf - $STACK_Q | zstd -q -1 -T0 | ssh -c $AES dst $(q "zstd -q -d | tar -C $(q "$TSITE") -xf -")"
}

# METHOD -> "kind build args": kind says how to prepare and run it.
declare -A KIND BUILD MARGS
METHODS=()
add_method() { METHODS+=("$1"); KIND[$1]=$2; BUILD[$1]=${3:-}; MARGS[$1]=${4:-}; }
list_methods() {
  local b sfx v name
  for b in new base; do
    [ $b = base ] && [ -z "$BASE" ] && continue
    sfx=""; [ $b = base ] && sfx=-base
    add_method "relay$sfx" ssh $b "--relay"
    add_method "direct$sfx" ssh $b "--direct"
    add_method "local$sfx" local $b ""
  done
  IFS=';' read -r -a vs <<< "$VARIANTS"
  for v in "${vs[@]}"; do
    v=$(echo "$v" | xargs)              # trim
    [ -z "$v" ] || [ "$v" = default ] && continue
    name=$(echo "$v" | tr -d ' =-')     # "--connections 4" -> connections4
    add_method "relay+$name" ssh new "--relay $v"
    add_method "direct+$name" ssh new "--direct $v"
  done
  if [ "$FANOUT" = 1 ]; then
    add_method fanout fan new ""
    add_method fanout+connections1 fan new "--connections 1"
  fi
  add_method rsync rsync "" ""
  add_method rsync-aes rsync "" "-c $AES"
  add_method tar-zstd tar "" ""
}

settle_cache() {
  sync
  case $CACHE in
    cold) echo 3 > /proc/sys/vm/drop_caches ;;
    # From the page cache after the first time: ~1 s for the torch stack.
    warm) (cd "$SITE" && find $STACK_NAMES -type f -print0 | xargs -0 -r -P 16 -n 64 cat > /dev/null) ;;
  esac
}

bin_of() { [ "$1" = base ] && echo "$BASE" || echo "$BIN"; }

# Prepare METHOD (untimed: its plan) and set CMD, the command to time.
prepare() { # prepare METHOD REP
  local m=$1 rep=$2 bin plan hosts
  case ${KIND[$m]} in
    ssh|local|fan)
      bin=$(bin_of "${BUILD[$m]}")
      case ${KIND[$m]} in ssh) hosts="src dst" ;; fan) hosts="src dst dst2" ;; *) hosts="lsrc ldst" ;; esac
      plan=$W/ctl/plan-$m.json
      (cd "$W/ctl" && "$bin" plan $hosts -o "$plan" > "$OUT/plan-$m-$rep.txt" 2>&1) ||
        { echo "  plan for $m failed:"; tail -5 "$OUT/plan-$m-$rep.txt"; return 1; }
      local extra=""; [ "${BUILD[$m]}" = new ] && extra="${EXTRA:-}"
      CMD=("$bin" apply "$plan" -vv ${MARGS[$m]} $extra) ;;
    rsync) CMD=(ssh src "$(rsync_cmd "${MARGS[$m]}")") ;;
    tar) CMD=(ssh src "$(tar_cmd)") ;;
  esac
}

declare -A TIMES
VERIFIED=""
run_method() { # run_method METHOD REP
  local m=$1 rep=$2
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $m "* ]] || return 0
  each_target reset_target
  CMD=()
  prepare "$m" "$rep" || return 0
  settle_cache
  local t0 t1 rc
  t0=$(date +%s.%N)
  # The controller's own CPU (this machine's side of the relay: libssh2
  # decrypting from the source and encrypting to the target) from bash's
  # `time` of the command and its children.
  # (The redirections inside a group of their own: `time` writes to the
  # timed pipeline's stderr otherwise.)
  { TIMEFORMAT='%U %S'; time { (cd "$W/ctl" && "${CMD[@]}") > "$OUT/$m-$rep.out" 2> "$OUT/$m-$rep.err"; }; } 2> "$W/cpu.txt"
  rc=$?
  sync
  t1=$(date +%s.%N)
  local s; s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')
  if [ $rc = 0 ]; then
    echo "TIME $m $rep $s"
    echo "CPU $m $rep controller user+sys $(awk '{printf "%.2f + %.2f s", $1, $2}' "$W/cpu.txt")"
    TIMES[$m]="${TIMES[$m]:-} $s"
  else
    echo "FAIL $m $rep $s rc=$rc:"; tail -5 "$OUT/$m-$rep.err" | sed 's/^/  /'
  fi
  grep -h "waits" "$OUT/$m-$rep.err" 2>/dev/null | sed "s/^/$m $rep: /" >> "$OUT/waits.txt"
  # The first run of each method of the build measured: is the target's
  # stack the source's?
  if [ $rc = 0 ] && [[ " $VERIFIED " != *" $m "* ]] &&
     { [ "$VERIFY" = all ] || { [ "$VERIFY" = 1 ] && [ "${BUILD[$m]}" = new ]; }; }; then
    VERIFIED="$VERIFIED $m"
    verify_stack "$m"
    if [ "${KIND[$m]}" = fan ]; then use_target 2; verify_stack "$m" dst2; use_target 1; fi
  fi
}

# "TYPE MODE PATH [-> LINK]" of every stack entry but bytecode, then the
# sha256 of every file but bytecode: the same on both sides after a
# correct apply. Bytecode is counted apart (overlay carries the source's
# __pycache__ of the files it carries, and may leave others). A RECORD is
# compared without its rows for bin/ scripts: the target's venv lies at
# another path, so overlay (as pip would) records the scripts with the
# target's shebang (docs/apply.md), which rsync and tar do not.
stack_state() { # stack_state SITE
  (cd "$1" && find $STACK_NAMES -not -path '*/__pycache__*' -printf '%y %m %p %l\n' | sort)
  (cd "$1" && find $STACK_NAMES -type f -not -path '*/__pycache__/*' -not -name RECORD -print0 |
     xargs -0 -r -P "$(nproc)" -n 256 sha256sum | sort -k2)
  (cd "$1" && for r in $(find $STACK_NAMES -name RECORD -path '*.dist-info/*' | sort); do
     printf '%s  %s\n' "$(grep -v '^\.\./\.\./\.\./bin/' "$r" | sha256sum | cut -c1-64)" "$r (no bin/ rows)"
   done)
}
verify_stack() { # verify_stack METHOD [TARGET-NAME]
  local f=$OUT/verify-$1${2:+-$2}.txt
  # The source's state once per run (it does not change).
  [ -s "$W/src.state" ] || stack_state "$SITE" > "$W/src.state"
  stack_state "$TSITE" > "$W/dst.state"
  local spyc tpyc
  spyc=$(cd "$SITE" && find $STACK_NAMES -name '*.pyc' | wc -l)
  tpyc=$(cd "$TSITE" && find $STACK_NAMES -name '*.pyc' 2>/dev/null | wc -l)
  if cmp -s "$W/src.state" "$W/dst.state"; then
    echo "VERIFY $1${2:+ ($2)} ok: $(grep -c '^f ' "$W/src.state") files and $(grep -c '^l ' "$W/src.state") links equal (sha256, mode), bytecode: source $spyc, target $tpyc" | tee "$f"
  else
    { echo "VERIFY $1${2:+ ($2)} FAILED: the target's stack differs from the source's (bytecode: source $spyc, target $tpyc)"
      diff "$W/src.state" "$W/dst.state" | head -40; } | tee "$f"
  fi
}

# ---------------------------------------------------------------------------
# The raw check: what this host moves through 1, 4 and 8 OpenSSH
# connections at once (RAW_MB in all, split between them).

raw_check() {
  [ "$RAW_MB" -gt 0 ] || return 0
  local n t0 t1 i
  for n in 1 4 8; do
    sync
    t0=$(date +%s.%N)
    for i in $(seq "$n"); do
      dd if=/dev/zero bs=1M count=$(( RAW_MB / n )) status=none | ssh -c "$AES" dst 'cat > /dev/null' &
    done
    wait
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v n="$n" -v mb="$RAW_MB" \
      'BEGIN{printf "RAW %d connections %d MiB %.2f s (%.2f GB/s)\n", n, mb, b-a, mb*1048576/(b-a)/1e9}'
  done | tee "$OUT/raw.txt"
}

# ---------------------------------------------------------------------------
# The summary: medians, ratios.

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END{if(NR==0){print "-"} else if(NR%2){print a[(NR+1)/2]} else {printf "%.2f\n",(a[NR/2]+a[NR/2+1])/2}}'; }
summary() {
  local m; declare -A MED
  echo "medians (s), $REPS reps, cache $CACHE:"
  for m in "${METHODS[@]}"; do
    [ -n "${TIMES[$m]:-}" ] || continue
    MED[$m]=$(echo "${TIMES[$m]}" | median)
    printf '  %-24s %7s   (%s)\n' "$m" "${MED[$m]}" "${TIMES[$m]# }"
  done
  echo "ratios:"
  ratio() { # ratio A B [GOAL]: A's median over B's
    [ -n "${MED[$1]:-}" ] && [ -n "${MED[$2]:-}" ] || return 0
    awk -v a="${MED[$1]}" -v b="${MED[$2]}" -v n="$1 / $2" -v g="${3:+(issue 45: <= $3)}" \
      'BEGIN{printf "  %-36s %5.2f  %s\n", n, a/b, g}'
  }
  # The issue's goals apply to the build measured (its default and its variants).
  local goal
  for m in "${METHODS[@]}"; do
    goal=1; [ "${BUILD[$m]}" = new ] || goal=""
    case $m in
      relay*) ratio "$m" rsync-aes ${goal:+0.90}; ratio "$m" local ${goal:+1.15} ;;
      direct*) ratio "$m" rsync-aes ${goal:+0.85} ;;
    esac
  done
  ratio fanout fanout+connections1
  ratio rsync-aes local
  grep -h '^VERIFY' "$OUT"/verify-*.txt 2>/dev/null | sed 's/^/  /'
  if [ -s "$OUT/waits.txt" ]; then
    echo "overlay's stream waits (apply -vv):"; sed 's/^/  /' "$OUT/waits.txt"
  fi
  [ ! -s "$OUT/raw.txt" ] || { echo "raw OpenSSH ($AES, dd | ssh 'cat > /dev/null'):"; sed 's/^/  /' "$OUT/raw.txt"; }
}

# ---------------------------------------------------------------------------

{
  echo "ssh-testbed: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r)"
  echo "overlay $BIN: $("$BIN" --version) sha256 $(sha256sum < "$BIN" | cut -c1-16)"
  [ -z "$BASE" ] || echo "base $BASE: $("$BASE" --version) sha256 $(sha256sum < "$BASE" | cut -c1-16)"
  echo "openssh: $(ssh -V 2>&1); rsync: $(rsync --version | sed -n 1p)"
  echo "venv $VENV (site $SITE); target $T; cache $CACHE; reps $REPS; variants: ${VARIANTS:-none}; extra: ${EXTRA:-none}"
  echo "stack: $(echo $STACK_NAMES | wc -w) names, dists: $(echo $STACK_DISTS)"
  (cd "$SITE" && echo "stack: $(find $STACK_NAMES -type f | wc -l) files, $(du -scb --apparent-size $STACK_NAMES | tail -1 | cut -f1) bytes")
  df -hT "$VENV" "$W" | sed 's/^/  /'
  if [ "$(stat -f -c %T "$W")" != "$(stat -f -c %T "$VENV")" ]; then
    echo "  warning: WORK ($W, $(stat -f -c %T "$W")) is not on the venv's kind of filesystem ($(stat -f -c %T "$VENV")): the target's writes are not measured on the storage the source is on; set WORK"
  fi
} | tee "$OUT/env.txt"
: > "$OUT/waits.txt"; rm -f "$OUT"/verify-*.txt "$W/src.state"

setup_sshd_account
setup_client
start_host src "$SRC_IP"
start_host dst "$DST_IP"
[ "$FANOUT" = 1 ] && start_host dst2 "$DST2_IP"
echo "hosts: src $SRC_IP:$PORT, dst $DST_IP:$PORT up; their sessions run $(ssh src 'command -v ssh rsync zstd' | tr '\n' ' ')" | tee -a "$OUT/env.txt"
each_target make_target
write_manifest
list_methods
echo "methods: ${METHODS[*]}"
runs=$(( ${#METHODS[@]} * REPS )); [ -z "${ONLY:-}" ] || runs=$(( $(echo $ONLY | wc -w) * REPS ))
echo "$runs timed runs; on the device each takes ~10-20 s with its reset, plan and settled cache, a guess (the per-command limit there is 10 min)"
raw_check

for rep in $(seq "$REPS"); do
  # The order rotates from one repetition to the next, so that no method
  # always follows the same one.
  n=${#METHODS[@]}
  for i in $(seq 0 $(( n - 1 ))); do
    run_method "${METHODS[$(( (i + rep - 1) % n ))]}" "$rep"
  done
done
each_target reset_target
summary | tee "$OUT/summary.txt"
