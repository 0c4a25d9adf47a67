# syntax=docker/dockerfile:1
# One image, two commands: `gpu-reaper controller` and `gpu-reaper webhook` (the Helm
# chart runs both). Build: docker build -t ghcr.io/gpu-reaper/gpu-reaper:0.1.0 .
# (docs/install.md#building-the-image). The binary uses rustls with the ring provider:
# no OpenSSL, so the runtime image only needs glibc.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build directory between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin gpu-reaper \
 && install -D target/release/gpu-reaper /out/gpu-reaper

# distroless: glibc and CA certificates, no shell, no package manager; runs as 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/gpu-reaper /gpu-reaper
USER 65532:65532
EXPOSE 8080 8443
ENTRYPOINT ["/gpu-reaper"]
CMD ["--help"]
