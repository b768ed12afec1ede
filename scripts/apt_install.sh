# Sourced by the setup scripts: apt_install NAME PKG... installs Debian packages, as root or
# through sudo, and fails with a clear line (naming NAME, the calling script) where it can't.
apt_install() {
    local who=$1 sudo=""
    shift
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || {
            echo "$who: need root or sudo to apt-get install $*" >&2; exit 1; }
        sudo="sudo"
    fi
    command -v apt-get >/dev/null 2>&1 || {
        echo "$who: no apt-get; install $* by hand" >&2; exit 1; }
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$@"
}
