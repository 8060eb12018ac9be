# tiergate: the server (`tiergate`) and its worker (`tiergate-reranker`) in one image; the server starts the
# worker as a child process in the same container (the shared-memory queue lives in /dev/shm).
#
#   docker build -t tiergate .                                   # CPU
#   docker build -t tiergate:cuda --build-arg CUDA=1 \
#       --build-arg BUILD_IMAGE=<a CUDA devel image with a Rust toolchain> \
#       --build-arg RUN_IMAGE=<the matching CUDA runtime image> .
#
# Models are not baked in: mount them at /opt/tiergate/models, or let scripts/fetch-models.sh fetch them
# (the Kubernetes manifests run it in an init container).
ARG BUILD_IMAGE=rust:1-bookworm
ARG RUN_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
ARG CUDA=0
WORKDIR /src
# llama.cpp (the CPU engine) compiles from source: cmake, and clang's libclang for its bindings.
RUN apt-get update && apt-get install -y --no-install-recommends cmake clang libclang-dev \
    && rm -rf /var/lib/apt/lists/*
COPY . .
RUN features=""; [ "$CUDA" = "1" ] && features="--features tiergate-reranker/cuda"; \
    cargo build --release --workspace --bins $features \
    && cp target/release/tiergate target/release/tiergate-reranker /usr/local/bin/

FROM ${RUN_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/tiergate /usr/local/bin/tiergate-reranker /usr/local/bin/
COPY scripts/fetch-models.sh /opt/tiergate/scripts/fetch-models.sh
WORKDIR /opt/tiergate
RUN useradd --system --uid 10001 tiergate && mkdir -p models && chown tiergate models
USER 10001
EXPOSE 8080
# The admin listener stays on loopback (reach it with `kubectl port-forward` or from a sidecar).
ENTRYPOINT ["tiergate", "serve"]
CMD ["--listen", "0.0.0.0:8080", "--admin-listen", "127.0.0.1:8081"]
