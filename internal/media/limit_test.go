package media

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
	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// TestDownloadsBackOffWhenWeChatThrottles: 40 media downloads at once
// while WeChat answers media/get with 45009 for 2 s, each retried by
// Keep until kept. Through the downloads' limit (overload.Limiter, cut
// by the throttle) WeChat gets fewer calls at once and fewer throttled
// calls in all than without it; every object is kept either way.
func TestDownloadsBackOffWhenWeChatThrottles(t *testing.T) {
	const n = 40
	run := func(limited bool) (int64, int64) {
		var throttled, peak atomic.Int64
		fake := wecomtest.NewHandler(wecomtest.Options{Accounts: []string{kfID}})
		var began time.Time
		var inFlight atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasSuffix(r.URL.Path, "/media/get") {
				fake.ServeHTTP(w, r)
				return
			}
			c := inFlight.Add(1)
			defer inFlight.Add(-1)
			time.Sleep(20 * time.Millisecond)
			if time.Since(began) < 2*time.Second {
				for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
				}
				throttled.Add(1)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"errcode":%d,"errmsg":"api freq out of limit"}`, wecom.CodeRateLimited)
				return
			}
			fake.ServeHTTP(w, r)
		}))
		defer srv.Close()
		kc, err := kf.New(kf.Config{BaseURL: srv.URL, CorpID: fake.CorpID(), Secret: fake.Secret()})
		if err != nil {
			t.Fatal(err)
		}
		store, err := NewDirStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		var opts []KeeperOption
		if limited {
			opts = append(opts, WithLimiter(overload.New(overload.DefaultConfig(MaxDownloadsInFlight), nil)))
		}
		k := NewKeeper(store, kc, KeeperConfig{CorpID: fake.CorpID(), MaxBytes: 1 << 20, Retries: 30, RetryBase: 100 * time.Millisecond}, opts...)
		refs := make([]Ref, n)
		for i := range refs {
			msgID, mediaID := fake.AddImage(kfID, fmt.Sprintf("wmUSER%d", i), []byte(fmt.Sprintf("image %d", i)))
			refs[i] = Ref{CorpID: fake.CorpID(), OpenKfID: kfID, MsgID: msgID, MsgType: "image", MediaID: mediaID}
		}
		began = time.Now()
		var wg sync.WaitGroup
		var failed atomic.Int64
		for _, ref := range refs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := k.Keep(context.Background(), "consumer", ref); err != nil {
					failed.Add(1)
					t.Errorf("keep %s: %v", ref.MediaID, err)
				}
			}()
		}
		wg.Wait()
		return throttled.Load(), peak.Load()
	}
	free, freePeak := run(false)
	limited, limitedPeak := run(true)
	t.Logf("throttled media/get calls %d with the limit (at most %d at once), %d without (at most %d)", limited, limitedPeak, free, freePeak)
	if 2*limited > free {
		t.Errorf("%d throttled calls with the limit, %d without: want at most half", limited, free)
	}
	if initial := int64(overload.DefaultConfig(MaxDownloadsInFlight).Initial); limitedPeak > initial {
		t.Errorf("%d calls at once with the limit, more than its initial %d", limitedPeak, initial)
	}
}
