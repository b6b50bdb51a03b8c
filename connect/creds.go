package connect

import (
	"fmt"
	"os"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// userCredentials is nats.UserCredentials(file) that keeps the last file it could read.
// The file is read at every connection, so a credential rotated under a running process
// (toolbus admin rotate rewrites the file, then revokes the old one) is taken on the
// reconnection the revocation causes. A file that is gone (toolbus admin remove-team)
// would fail every attempt before the server is asked, forever: with the last one read
// the server refuses the revoked credential, nats.go gives up after the same refusal
// twice and closes the connection, and the process stops saying why
// (worker.ErrConnectionClosed), as the TypeScript executor does. A file that cannot be
// read at start is an error.
func userCredentials(file string) (nats.Option, error) {
	read := func() (string, nkeys.KeyPair, error) {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", nil, err
		}
		jwt, err := nkeys.ParseDecoratedJWT(b)
		if err != nil {
			return "", nil, err
		}
		kp, err := nkeys.ParseDecoratedUserNKey(b)
		if err != nil {
			return "", nil, err
		}
		return jwt, kp, nil
	}
	var mu sync.Mutex
	jwt, kp, err := read()
	if err != nil {
		return nil, fmt.Errorf("connect: credentials %s: %w", file, err)
	}
	user := func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if j, k, err := read(); err == nil {
			jwt, kp = j, k
		}
		return jwt, nil
	}
	sign := func(nonce []byte) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		return kp.Sign(nonce)
	}
	return nats.UserJWT(user, sign), nil
}
