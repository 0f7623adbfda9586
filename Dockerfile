# courier's image: a static binary on distroless, running as a non-root user.
#
#   docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t courier .
#
# Releases are built by .github/workflows/release.yml for linux/amd64 and
# linux/arm64.
#
# cmd/courier/build_test.go builds the binary with the `go build` line below
# and runs it: keep that command on one RUN line.

# The build stage runs on the builder's platform and cross-compiles (pure Go,
# CGO_ENABLED=0), so a multi-arch build (docker buildx --platform
# linux/amd64,linux/arm64) needs no emulation. Its Go is go.mod's exact
# version, and GOTOOLCHAIN=local makes a mismatch fail instead of downloading
# another toolchain (cmd/courier/build_test.go checks both).
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS build
ENV GOTOOLCHAIN=local
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# Set by buildx for each platform of the image.
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -tags nodemo -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/courier ./cmd/courier
# The dedup directory, owner-only like the one courier creates itself; copied
# with the nonroot owner so that a fresh volume mounted there starts writable.
RUN mkdir -m 0700 /out/data

# static-debian12 has CA certificates and tzdata, nothing else: no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/courier /courier
COPY --from=build --chown=65532:65532 /out/data /var/lib/courier
ENV COURIER_DEDUP_DIR=/var/lib/courier
VOLUME /var/lib/courier
# /healthz, /readyz, /metrics (COURIER_ADMIN_ADDR).
EXPOSE 7415
# nonroot, numeric so that Kubernetes' runAsNonRoot can check it.
USER 65532:65532
ENTRYPOINT ["/courier"]
