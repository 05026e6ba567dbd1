# ackd in a container.
#
#   docker build -t ackd .
#   docker run --rm \
#       -e KAFKA_URL=kafka+ssl://broker-1:9096,kafka+ssl://broker-2:9096 \
#       -e ACKD_TOPICS=orders -e ACKD_GROUP_ID=billing \
#       ackd
#
# Nothing is configured at build time and no secret is baked in: every setting (KAFKA_URL,
# ACKD_*, ACKD_RDKAFKA_* pass-through, certificates) is given to `docker run -e ...`, an
# --env-file, or the orchestrator's secrets. ackd logs logfmt lines to stdout only.
#
# Stopping: `docker stop` sends SIGTERM (STOPSIGNAL below) and SIGKILLs after 10 s by
# default, but a graceful stop may take up to ACKD_SHUTDOWN_TIMEOUT_MS (25 s by default).
# Give the container a longer grace period: `docker stop -t 30`, `docker run
# --stop-timeout 30`, compose `stop_grace_period: 30s`, Kubernetes
# `terminationGracePeriodSeconds: 30`. Or lower ACKD_SHUTDOWN_TIMEOUT_MS below it.

# ---- build --------------------------------------------------------------------------
# Same Debian release as the runtime stage, so the binary's glibc and OpenSSL match.
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-slim-bookworm AS build

# rdkafka builds librdkafka from source (its ./configure and make, not cmake) with the
# `ssl` and `zstd` features: a C/C++ toolchain and make (build-essential), OpenSSL and
# zlib headers found through pkg-config. zstd is compiled in by zstd-sys.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        pkg-config libssl-dev zlib1g-dev build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src

# Dependencies first, against a dummy crate, so that this slow layer (librdkafka alone
# takes minutes) is rebuilt only when Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked --bin ackd \
    && rm -rf src

# Then ackd itself. config/default.toml is compiled into the binary (include_str!).
COPY src ./src
COPY config ./config
# COPY keeps the files' mtimes, which can be older than the dummy build: make sure cargo
# rebuilds ackd rather than keeping the dummy.
RUN touch src/lib.rs src/main.rs \
    && rm -rf target/release/.fingerprint/ackd-* \
    && cargo build --release --locked --bin ackd \
    && install -m 0755 target/release/ackd /usr/local/bin/ackd

# ---- runtime ------------------------------------------------------------------------
FROM debian:bookworm-slim

# Debian packages the exec processor's handler needs (its runtime), e.g.
#   docker build --build-arg EXTRA_PACKAGES=python3 -t ackd-py .
# for ACKD_PROCESSOR=exec ACKD_EXEC_COMMAND="python3 /app/handler.py".
# docs/deploying.md shows how to add the handler itself. Empty: ackd alone.
ARG EXTRA_PACKAGES=""

# What the binary links dynamically (`ldd target/release/ackd`): libssl.so.3 and
# libcrypto.so.3 (libssl3), libz.so.1 (zlib1g), libgcc_s, libm, libc (in the base image).
# ca-certificates: the CA bundle for kafka+ssl:// brokers that use public CAs.
# tini: PID 1 (see ENTRYPOINT).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g tini \
        ${EXTRA_PACKAGES} \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 ackd \
    && useradd --system --uid 10001 --gid ackd --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin ackd

COPY --from=build /usr/local/bin/ackd /usr/local/bin/ackd

# The ackd user, by number so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001

# ackd handles SIGTERM and SIGINT itself: stop fetching, finish in-flight messages,
# commit, leave the group, exit 0.
STOPSIGNAL SIGTERM

# PID 1 is tini, ackd its one child. PID 1 has two duties. It must pass SIGTERM on: tini
# forwards it to ackd (to ackd only, not its process group: ackd stops its exec children
# itself, after their in-flight messages), and exits with ackd's exit code. And it must
# reap orphans: the exec processor's children (`sh -c "$ACKD_EXEC_COMMAND"`) may start
# processes of their own, and when a child dies first its children are re-parented to
# PID 1 and stay zombies until PID 1 waits for them. ackd cannot do that itself: a
# waitpid(-1) loop would also take the exit statuses of the children that tokio waits
# for by pid. Exec form throughout: the shell form (`ENTRYPOINT ackd`) would make
# `/bin/sh -c` PID 1, which forwards no signal, and ackd would be SIGKILLed at the end
# of the grace period with nothing committed since its last periodic commit.
# Arguments go to ackd: `docker run ackd --help`.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/ackd"]
