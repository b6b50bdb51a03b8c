// Package connect opens a connection to the toolbus bus from the same TOOLBUS_*
// configuration the toolbus binary reads: the server URL and every NATS credential kind
// (creds file, nkey seed, user/password, token, TLS). The binary and custom executors
// built with package executor use it alike, so a deployment configures both the same way.
package connect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"
)

// EnvPrefix is the prefix of every toolbus environment variable.
const EnvPrefix = "TOOLBUS"

// ErrNoURL is returned by Dial when no server URL is configured.
var ErrNoURL = errors.New("connect: TOOLBUS_NATS_URL is not set")

// Options are the connection settings, read from TOOLBUS_NATS_* variables.
type Options struct {
	// URL of the NATS server (TOOLBUS_NATS_URL). The toolbus binary starts an embedded
	// server when it is empty; Dial refuses.
	URL      string `envconfig:"NATS_URL" desc:"NATS server URL; empty runs an embedded JetStream server"`
	Creds    string `envconfig:"NATS_CREDS" desc:"NATS credentials file (JWT + nkey seed)"`
	NKeySeed string `envconfig:"NATS_NKEY" desc:"NATS nkey seed file"`
	User     string `envconfig:"NATS_USER" desc:"NATS user"`
	Password string `envconfig:"NATS_PASSWORD" desc:"NATS password"`
	Token    string `envconfig:"NATS_TOKEN" desc:"NATS token"`
	TLSCA    string `envconfig:"NATS_TLS_CA" desc:"CA certificate file to verify the NATS server"`
	TLSCert  string `envconfig:"NATS_TLS_CERT" desc:"client certificate file (mutual TLS)"`
	TLSKey   string `envconfig:"NATS_TLS_KEY" desc:"client key file (mutual TLS)"`
}

// FromEnv reads Options from the TOOLBUS_NATS_* environment variables.
func FromEnv() (Options, error) {
	var o Options
	if err := envconfig.Process(EnvPrefix, &o); err != nil {
		return o, fmt.Errorf("connect: %w", err)
	}
	return o, nil
}

// NATSOptions returns the nats.go options for o: credentials, TLS and reconnection
// forever with connection events logged. name names the connection on the server.
// A credential file that cannot be read is an error, never ignored.
func (o Options) NATSOptions(name string, log *slog.Logger) ([]nats.Option, error) {
	if log == nil {
		log = slog.Default()
	}
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
	}
	if o.Creds != "" {
		opt, err := userCredentials(o.Creds)
		if err != nil {
			return nil, err
		}
		opts = append(opts, opt)
	}
	if o.NKeySeed != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("connect: nkey seed %s: %w", o.NKeySeed, err)
		}
		opts = append(opts, opt)
	}
	if o.User != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	return opts, nil
}

// Dial connects to o.URL. ctx bounds the first connection attempt only.
func Dial(ctx context.Context, o Options, name string, log *slog.Logger) (*nats.Conn, error) {
	if o.URL == "" {
		return nil, ErrNoURL
	}
	opts, err := o.NATSOptions(name, log)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(time.Until(dl)))
	}
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect: %s: %w", o.URL, err)
	}
	return nc, nil
}

// Secrets are the values of o's credentials: the password and token, the nkey seed and
// the credentials file's JWT and seed (not the file's "-----BEGIN ..." armour and
// prose). An executor redacts them, and their hex, URL and base64 encodings, from every
// text a tool influences (executor.WithSecrets): a tool that prints its environment or a
// file it found must not hand them to the model, the stream or the console. An unreadable file adds nothing
// (the connection reports it).
func (o Options) Secrets() []string {
	out := []string{o.Password, o.Token}
	for _, f := range []string{o.NKeySeed, o.Creds} {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "---") && !strings.Contains(line, " ") {
				out = append(out, line)
			}
		}
	}
	return out
}
