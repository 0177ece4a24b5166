package kf_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/kf"
)

// countingCache counts the tokens stored in it.
type countingCache struct {
	*wecom.MemoryTokenCache
	sets atomic.Int32
}

func (c *countingCache) Set(ctx context.Context, key, val string, ttl time.Duration) error {
	c.sets.Add(1)
	return c.MemoryTokenCache.Set(ctx, key, val, ttl)
}

// TestTokenCacheIsOneInterface: kf.TokenCache is the WeChat client's own
// interface, not a second one of the same shape (a pointer to one is a
// pointer to the other only when they are the same type), and the cache
// given to kf.New is the one the client keeps its token in.
func TestTokenCacheIsOneInterface(t *testing.T) {
	cc := &countingCache{MemoryTokenCache: wecom.NewMemoryTokenCache(nil)}
	var c kf.TokenCache = cc
	var _ *wecom.TokenCache = &c
	fake, _, _ := setup(t)
	kc, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret(), Tokens: c})
	if err != nil {
		t.Fatal(err)
	}
	fake.AddText("wk1", "u1", "hi")
	if _, err := kc.Send(context.Background(), "wk1", "u1", "", kf.Text{Content: "hello"}); err != nil {
		t.Fatal(err)
	}
	if n := cc.sets.Load(); n != 1 {
		t.Fatalf("the cache given to kf.New stored %d tokens, want 1", n)
	}
}
