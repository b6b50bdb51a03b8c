# One image, every role: `toolbus planner|executor|injector|up|run`.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/toolbus ./cmd/toolbus

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/toolbus /usr/local/bin/toolbus
ENTRYPOINT ["/usr/local/bin/toolbus"]
