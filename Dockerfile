# Builds all nodegate binaries; pick one per image with --target.
# (Not built in CI: no container engine is available there.)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --workspace --bins

FROM gcr.io/distroless/cc-debian12:nonroot AS webhook
COPY --from=build /src/target/release/nodegate-webhook /usr/local/bin/nodegate-webhook
ENTRYPOINT ["/usr/local/bin/nodegate-webhook"]

FROM gcr.io/distroless/cc-debian12:nonroot AS certs
COPY --from=build /src/target/release/nodegate-certs /usr/local/bin/nodegate-certs
ENTRYPOINT ["/usr/local/bin/nodegate-certs"]

FROM gcr.io/distroless/cc-debian12:nonroot AS roster
COPY --from=build /src/target/release/nodegate-roster /usr/local/bin/nodegate-roster
ENTRYPOINT ["/usr/local/bin/nodegate-roster"]

# The agent runs exec probes through `sh`, so it gets a shell.
FROM debian:bookworm-slim AS agent
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/nodegate-agent /usr/local/bin/nodegate-agent
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/nodegate-agent"]
