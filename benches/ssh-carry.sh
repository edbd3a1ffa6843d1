#!/bin/bash
# benches/ssh-carry.sh DIR: copy this machine's OpenSSH (sshd, ssh,
# sftp-server, ssh-keygen), rsync and zstd, with the shared libraries they
# need, into DIR, for benches/ssh-testbed.sh on a host that has none of them
# (the device: Ubuntu 24.04, no network). Made on Debian 12; see
# docs/benchmarks.md, "Issue 45: the 16-core sshd testbed".
#
#   benches/ssh-carry.sh .dev/ssh      # then carry .dev/ssh to the other host
#
# DIR/libexec/  the real binaries
# DIR/lib/      the libraries `ldd` names for them, except glibc's own
#               (libc, libm, libresolv, ...: the host's newer glibc serves
#               those; a Debian 12 libresolv beside Ubuntu's libc would
#               not load) and the loader
# DIR/bin/      one small wrapper per tool that runs DIR/libexec/TOOL with
#               LD_LIBRARY_PATH=DIR/lib. Only these processes see that
#               variable: sshd builds a fresh environment for its sessions,
#               so the remote rsync, zstd and sftp-server get their
#               libraries through the same wrappers (PATH=DIR/bin), while
#               the venv's python and everything else keep the host's own
#               libcrypto, libz, ...
#
# Nothing is stripped or changed; the total size is printed (the device's
# carry limit is 64 MiB for everything). DIR must be ignored by git
# (.dev/ is, in .git/info/exclude): never commit these binaries.
set -euo pipefail
DIR=${1:?usage: benches/ssh-carry.sh DIR}

# The tools, by the name the wrapper gets.
declare -A TOOLS=(
  [sshd]=/usr/sbin/sshd
  [ssh]=/usr/bin/ssh
  [sftp-server]=/usr/lib/openssh/sftp-server
  [ssh-keygen]=/usr/bin/ssh-keygen
  [rsync]=/usr/bin/rsync
  [zstd]=/usr/bin/zstd
)
# Libraries of glibc itself: the target host's glibc (2.39 on the device)
# provides them, and must, since they are tied to its libc.so.6.
GLIBC_RE='^(libc|libm|libresolv|libpthread|libdl|librt|libutil|libanl|libBrokenLocale|libmvec|libnss_[a-z]+|ld-linux-x86-64)\.so'

missing=()
for t in "${!TOOLS[@]}"; do [ -x "${TOOLS[$t]}" ] || missing+=("${TOOLS[$t]}"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "ssh-carry: missing ${missing[*]}: apt-get install openssh-server openssh-client rsync zstd" >&2
  exit 1
fi

rm -rf "$DIR/bin" "$DIR/libexec" "$DIR/lib"
mkdir -p "$DIR/bin" "$DIR/libexec" "$DIR/lib"

copy_libs() { # copy_libs BINARY: its non-glibc libraries into DIR/lib
  # ldd prints "name => /path (addr)"; lines without "=>" are the vdso and the loader.
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $GLIBC_RE ]] && continue
    [ -e "$DIR/lib/$name" ] || cp -L "$path" "$DIR/lib/$name"
  done
}

for t in "${!TOOLS[@]}"; do
  cp -p "${TOOLS[$t]}" "$DIR/libexec/$t"
  copy_libs "${TOOLS[$t]}"
  # The wrapper finds DIR from its own path, so DIR may be moved or carried
  # anywhere. sshd must be started by an absolute path (it re-executes
  # itself); exec keeps that path absolute.
  cat > "$DIR/bin/$t" <<'SH'
#!/bin/sh
d=$(dirname "$(dirname "$(readlink -f "$0")")")
LD_LIBRARY_PATH="$d/lib" exec "$d/libexec/$(basename "$0")" "$@"
SH
  chmod 755 "$DIR/bin/$t"
done

# A check here, through the wrappers and the carried libraries only.
"$DIR/bin/ssh" -V
"$DIR/bin/rsync" --version | sed -n 1p
"$DIR/bin/zstd" --version
echo "ssh-carry: $DIR: ${#TOOLS[@]} tools, $(ls "$DIR/lib" | wc -l) libraries ($(ls "$DIR/lib" | tr '\n' ' '))"
echo "ssh-carry: total $(du -sb "$DIR" | cut -f1) bytes ($(du -sh "$DIR" | cut -f1))"
