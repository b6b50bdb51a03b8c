package console

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbus/toolbus"
	"github.com/toolbus/toolbus/events/eventstest"
	"github.com/toolbus/toolbus/planner"
)

// consumers counts the consumers of every stream of the account (what the server's
// per-stream limits count); -1 when the server did not answer.
func consumers(ctx context.Context, js jetstream.JetStream) int {
	info, err := js.AccountInfo(ctx)
	if err != nil {
		return -1
	}
	return info.Consumers
}

// TestConsoleBoundedReaders loads the console with hundreds of page loads and a thousand
// live streams from many clients at once: the consumers on the server stay bounded (the
// streams share one watcher, the pages a few readers that delete their consumers), the
// pages are served, streams beyond the cap are refused, and meanwhile a run
// completes as usual.
func TestConsoleBoundedReaders(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of requests")
	}
	scripts := consoleScripts()
	for i := range 3 {
		scripts[fmt.Sprintf("c-load-%d", i)] = &planner.Script{Steps: []func(planner.Request) planner.Response{
			planner.Calls(call("n", "noop", `{}`)), planner.Answer("ok"),
		}}
	}
	// Thousands of requests under -race on a busy machine take minutes.
	defer func(d time.Duration) { pipelineDeadline = d }(pipelineDeadline)
	pipelineDeadline = 10 * time.Minute
	p := startPipeline(t, scripts, deployTool())
	srv, users, _ := startConsoleWithUsers(t, p, "ivy")
	tok := users["ivy"]
	p.submit("c-load-0", toolbus.Limits{})
	p.WaitStatus("c-load-0", toolbus.RunCompleted)
	js, err := jetstream.New(p.srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	// The workers' consumers, the console's one watcher, and the pages' readers.
	base := consumers(p.ctx, js)
	if base < 0 {
		t.Fatal("no account info")
	}
	bound := base + 2*consoleReaders + 2

	var maxSeen atomic.Int64
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if n := int64(consumers(p.ctx, js)); n > maxSeen.Load() {
				maxSeen.Store(n)
			}
			select {
			case <-stopWatch:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	getStatus := func(path string) (int, error) {
		req, _ := http.NewRequestWithContext(p.ctx, http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
			return resp.StatusCode, fmt.Errorf("%s", b)
		}
		_, _ = bufio.NewReader(resp.Body).Discard(1 << 30)
		return resp.StatusCode, nil
	}

	// Live streams: more than the cap, all open at once, from separate connections.
	const streams = consoleMaxStreams + 200
	sctx, closeStreams := context.WithCancel(p.ctx)
	var opened, refused atomic.Int64
	var swg sync.WaitGroup
	sem := make(chan struct{}, 100)
	for i := range streams {
		swg.Add(1)
		sem <- struct{}{}
		go func() {
			defer swg.Done()
			path := "/events"
			if i%2 == 1 {
				path = "/events?run=c-load-1"
			}
			req, _ := http.NewRequestWithContext(sctx, http.MethodGet, srv.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
			<-sem
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				refused.Add(1)
				return
			}
			line, _ := bufio.NewReader(resp.Body).ReadString('\n')
			if strings.HasPrefix(line, "event: ready") {
				opened.Add(1)
			}
			<-sctx.Done()
		}()
	}
	eventstest.Eventually(t, 2*time.Minute, func() error {
		if got := opened.Load() + refused.Load(); got < streams {
			return fmt.Errorf("%d of %d streams answered", got, streams)
		}
		return nil
	})
	if opened.Load() != consoleMaxStreams || refused.Load() != streams-consoleMaxStreams {
		t.Fatalf("%d streams opened and %d refused, want %d and %d", opened.Load(), refused.Load(), consoleMaxStreams, streams-consoleMaxStreams)
	}

	// Page loads, two clients per reader slot, while the streams are open; and a run.
	// More at once would only queue for the slots: past consoleReadWait a page is
	// answered 503 (busy), which a machine loaded by other tests can reach.
	p.SubmitAs("c-load-1", "tester", "under load", toolbus.Limits{})
	// Each page load reads the bus (with direct gets, no consumer): 200 of them keep the
	// test inside the pipeline's deadline on a loaded machine under -race.
	const loads = 200
	var failed atomic.Int64
	var firstErr atomic.Value
	var lwg sync.WaitGroup
	lsem := make(chan struct{}, 2*consoleReaders)
	for i := range loads {
		lwg.Add(1)
		lsem <- struct{}{}
		go func() {
			defer lwg.Done()
			defer func() { <-lsem }()
			path := "/"
			if i%2 == 1 {
				path = "/runs/c-load-0"
			}
			code, err := getStatus(path)
			if err != nil || code != http.StatusOK {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("GET %s: %d %v", path, code, err))
			}
		}()
	}
	lwg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d page loads failed, first: %v", n, loads, firstErr.Load())
	}
	p.WaitStatus("c-load-1", toolbus.RunCompleted)
	// A run started meanwhile reaches the live streams and completes.
	p.submit("c-load-2", toolbus.Limits{})
	p.WaitStatus("c-load-2", toolbus.RunCompleted)

	closeStreams()
	swg.Wait()
	close(stopWatch)
	<-watched
	if m := maxSeen.Load(); m > int64(bound) {
		t.Fatalf("up to %d consumers during the load, want at most %d (%d before it)", m, bound, base)
	}
	// And none linger afterwards.
	eventstest.Eventually(t, 30*time.Second, func() error {
		n := 0
		for name := range js.StreamNames(p.ctx).Name() {
			st, err := js.Stream(p.ctx, name)
			if err != nil {
				return err
			}
			for range st.ListConsumers(p.ctx).Info() {
				n++
			}
		}
		if n > base {
			return fmt.Errorf("%d consumers after the load, %d before", n, base)
		}
		return nil
	})
}
