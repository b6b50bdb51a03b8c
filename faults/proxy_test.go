package faults_test

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// tcpProxy forwards TCP connections to a NATS server; cut closes every connection it
// carries and refuses new ones (the client sees the server gone, as in a network
// partition), heal accepts them again. holdAtPublish freezes its connections, both
// ways, from the moment the client publishes on a subject: what the client sent is
// delivered late, when release is called (a message held in the network, with no
// connection closed on either side).
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	cuts  bool
	conns map[net.Conn]struct{}
	// holdOn is the subject part whose publication freezes the connections; tripped is
	// closed when it did, held is true until release.
	holdOn  []byte
	tripped chan struct{}
	held    bool
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.release(); p.cut() })
	return p
}

func (p *tcpProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cuts
		p.mu.Unlock()
		if cut {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go p.pipe(s, c, true)
		go p.pipe(c, s, false)
	}
}

// pipe copies src to dst; fromClient: src is the client (its publications may trip the
// hold). Each chunk read waits while the proxy holds, so a held chunk is delivered whole
// and in order on release.
func (p *tcpProxy) pipe(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 64<<10)
	var tail []byte // the end of the previous chunk: a line may span two reads
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if fromClient && p.holdOn != nil && publishes(append(tail, buf[:n]...), p.holdOn) {
				p.held, p.holdOn = true, nil
				close(p.tripped)
			}
			for p.held {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
			if fromClient {
				tail = append(tail[:0], buf[max(0, n-1024):n]...)
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// cut drops every connection and refuses new ones until heal.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	p.cuts = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
}

func (p *tcpProxy) heal() {
	p.mu.Lock()
	p.cuts = false
	p.mu.Unlock()
}

// publishes reports whether chunk has a NATS publication (PUB or HPUB) on a subject
// containing part.
func publishes(chunk, part []byte) bool {
	for _, line := range bytes.Split(chunk, []byte("\r\n")) {
		if (bytes.HasPrefix(line, []byte("PUB ")) || bytes.HasPrefix(line, []byte("HPUB "))) && bytes.Contains(line, part) {
			return true
		}
	}
	return false
}

// holdAtPublish arms the hold: the first publication on a subject containing part
// freezes every connection of the proxy until release. The returned channel is closed
// when it happened.
func (p *tcpProxy) holdAtPublish(part string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdOn, p.tripped = []byte(part), make(chan struct{})
	return p.tripped
}

// release delivers what the hold kept and lets the connections flow again.
func (p *tcpProxy) release() {
	p.mu.Lock()
	p.held, p.holdOn = false, nil
	p.cond.Broadcast()
	p.mu.Unlock()
}
