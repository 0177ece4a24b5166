package reply_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/overload"
	"github.com/kfpipe/kfpipe/internal/reply"
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// throttledWeChat is the fake WeChat behind a front that answers every
// send_msg with errcode within the throttle window (from its start for
// window) and counts the calls made in it.
type throttledWeChat struct {
	fake      *wecomtest.Server
	srv       *httptest.Server
	errcode   int
	window    time.Duration
	began     time.Time
	throttled atomic.Int64 // send_msg calls answered with the throttle
	inFlight  atomic.Int64
	peak      atomic.Int64 // the most send_msg calls at once within the window
}

func newThrottledWeChat(t *testing.T, errcode int, window time.Duration) *throttledWeChat {
	w := &throttledWeChat{fake: wecomtest.NewHandler(wecomtest.Options{Accounts: []string{"wk"}}), errcode: errcode, window: window}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/kf/send_msg") {
			w.fake.ServeHTTP(rw, r)
			return
		}
		n := w.inFlight.Add(1)
		defer w.inFlight.Add(-1)
		for p := w.peak.Load(); n > p && time.Since(w.began) < w.window && !w.peak.CompareAndSwap(p, n); p = w.peak.Load() {
		}
		time.Sleep(20 * time.Millisecond) // WeChat's answer time
		if time.Since(w.began) < w.window {
			w.throttled.Add(1)
			rw.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(rw, `{"errcode":%d,"errmsg":"api freq out of limit"}`, w.errcode)
			return
		}
		w.fake.ServeHTTP(rw, r)
	}))
	t.Cleanup(w.srv.Close)
	return w
}

// replyAll has each of users customers' messages answered once, by one
// handler call each at the same time, each call retried (as the consumer
// retries a message) 100 ms after a failed reply until it is sent.
func replyAll(t *testing.T, w *throttledWeChat, fx *reply.Effects, users int) {
	t.Helper()
	targets := make([]reply.Target, users)
	for i := range targets {
		u := fmt.Sprintf("u%d", i)
		targets[i] = reply.Target{OpenKfID: "wk", UpstreamMsgID: w.fake.AddText("wk", u, "hi"), User: u, SendTime: time.Now().Unix()}
	}
	w.began = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, to := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				err := reply.DoContent(reply.With(ctx, fx, to), "reply", "ok", func(ctx context.Context, kc *kf.Client, to reply.Target, msgID string) error {
					_, err := kc.Send(ctx, to.OpenKfID, to.User, msgID, kf.Text{Content: "ok"})
					return err
				})
				if err == nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	for _, to := range targets {
		if n := len(w.fake.Replies("wk", to.User)); n != 1 {
			t.Errorf("%s got %d replies, want 1", to.User, n)
		}
	}
}

// TestRepliesBackOffWhenWeChatThrottles: 60 handler calls reply at once
// while WeChat throttles send_msg for 2 s (each of 45009, 45011, 45033),
// each call retried until its reply is sent. Through the replies' limit
// (overload.Limiter, cut by the throttles) WeChat gets fewer calls at
// once and fewer throttled calls in all than without it, where every
// call's retries (the client's own four tries, then the message's)
// multiply; every customer gets the reply once either way.
func TestRepliesBackOffWhenWeChatThrottles(t *testing.T) {
	const users = 60
	for _, code := range []int{wecom.CodeRateLimited, wecom.CodeTooFrequent, wecom.CodeConcurrencyLimit} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			repliesUnderThrottle(t, code, users)
		})
	}
}

func repliesUnderThrottle(t *testing.T, code, users int) {
	{
		run := func(limited bool) (throttled, peak int64) {
			w := newThrottledWeChat(t, code, 2*time.Second)
			kc, err := kf.New(kf.Config{BaseURL: w.srv.URL, CorpID: w.fake.CorpID(), Secret: w.fake.Secret()})
			if err != nil {
				t.Fatal(err)
			}
			var opts []reply.Option
			if limited {
				opts = append(opts, reply.WithLimiter(overload.New(overload.DefaultConfig(reply.MaxRepliesInFlight), nil)))
			}
			replyAll(t, w, reply.New(kc, nil, opts...), users)
			return w.throttled.Load(), w.peak.Load()
		}
		free, freePeak := run(false)
		limited, limitedPeak := run(true)
		t.Logf("errcode %d: throttled send_msg calls %d with the limit (at most %d at once), %d without (at most %d)",
			code, limited, limitedPeak, free, freePeak)
		if 3*limited > free {
			t.Errorf("errcode %d: %d throttled calls with the limit, %d without: want at most a third", code, limited, free)
		}
		if limitedPeak > int64(overload.DefaultConfig(reply.MaxRepliesInFlight).Initial) {
			t.Errorf("errcode %d: %d calls at once with the limit, more than its initial %d", code, limitedPeak,
				overload.DefaultConfig(reply.MaxRepliesInFlight).Initial)
		}
	}
}
