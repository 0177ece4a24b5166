package service

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/daemon"
	"github.com/kfpipe/kfpipe/internal/handler"
	"github.com/kfpipe/kfpipe/internal/media"
	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// mediaHandler reads each message's media from the store, as
// kfpipe.OpenMedia does. The image's first delivery fails (3 attempts in
// place, then the DLQ); on its last failing attempt WeChat forgets the
// media_id, as it does after 3 days, so the DLQ retry finds only what the
// store kept.
type mediaHandler struct {
	fake         *wecomtest.Server
	imageID      string // media_id of the image
	getsAtExpiry int    // media/get calls when WeChat forgot the image

	mu       sync.Mutex
	attempts map[string]int
	before   map[string]bool   // the media was in the store when the handler first ran
	read     map[string][]byte // bytes read on the successful attempt
	retried  map[string]bool   // the successful attempt was a DLQ retry
	refused  map[string]string // ErrRefused's message
}

func (h *mediaHandler) Handle(ctx context.Context, m *chatmsg.ChatMessage) error {
	k := media.KeeperFrom(ctx)
	if k == nil {
		return errors.New("no media keeper in the handler's context")
	}
	ref, ok := k.RefOf(m)
	if !ok {
		return nil
	}
	h.mu.Lock()
	h.attempts[m.UpstreamMsgID]++
	n := h.attempts[m.UpstreamMsgID]
	h.mu.Unlock()
	key, _ := ref.Key()
	if n == 1 {
		_, err := k.Store().Stat(ctx, key)
		h.mu.Lock()
		h.before[m.UpstreamMsgID] = err == nil
		h.mu.Unlock()
	}
	if ref.MediaID == h.imageID && !handler.DeliveryFrom(ctx).RetryFromDLQ {
		if n == 3 {
			h.fake.ExpireMedia(ref.MediaID) // "day 4": WeChat no longer has it
			h.mu.Lock()
			h.getsAtExpiry = h.fake.MediaGets()
			h.mu.Unlock()
		}
		return errors.New("downstream hiccup")
	}
	rc, _, err := k.Open(ctx, ref)
	if errors.Is(err, media.ErrRefused) {
		h.mu.Lock()
		h.refused[m.UpstreamMsgID] = err.Error()
		h.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.read[m.UpstreamMsgID] = b
	h.retried[m.UpstreamMsgID] = handler.DeliveryFrom(ctx).RetryFromDLQ
	h.mu.Unlock()
	return nil
}

// TestDLQRetryAfterMediaExpired runs kf-producer, schedule-consumer and
// dlq-consumer on the real broker and Redis with a media store: a
// customer's image is in the store before its handler runs; its message
// fails into the DLQ, WeChat expires the media_id (40007), and the DLQ
// retry still reads the image's bytes from the store. A file over
// media.max_bytes is refused with a reason and its message still reaches
// the handler.
func TestDLQRetryAfterMediaExpired(t *testing.T) {
	pc := newPlace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const kf = "wk-media"
	fake := wecomtest.New(wecomtest.Options{CorpID: "ww-test-corp", Secret: "test-secret", Accounts: []string{kf}})
	defer fake.Close()
	store := t.TempDir() // shared by kf-producer and the consumer, as a mounted volume would be
	mediaCfg := func(m *config.Media) {
		m.Store, m.Dir, m.MaxBytes, m.RetryBase = "dir", store, 64<<10, 10*time.Millisecond
	}

	pcfg := pc.producerConfig(t, fake, kf)
	mediaCfg(&pcfg.Media)
	ccfg := pc.consumerConfig(t)
	ccfg.WeCom.BaseURL = fake.URL()
	mediaCfg(&ccfg.Media)
	dcfg := pc.dlqConfig(t)

	img := bytes.Repeat([]byte{0xff, 0xd8, 0xff, 0xe0}, 2048)
	imgMsg, imgID := fake.AddImage(kf, "wm-photo", img)
	bigMsg, _ := fake.AddMedia(kf, "wm-big", "file", "scan.pdf", "application/pdf", make([]byte, 100<<10))
	voice := []byte("#!AMR\n voice note")
	voiceMsg, _ := fake.AddMedia(kf, "wm-voice", "voice", "", "audio/amr", voice)

	h := &mediaHandler{fake: fake, imageID: imgID, attempts: map[string]int{}, before: map[string]bool{},
		read: map[string][]byte{}, retried: map[string]bool{}, refused: map[string]string{}}
	pl := startPipeline(t, ctx, pcfg, ccfg, dcfg, func(cbase *daemon.Base) handler.Handler {
		k, err := media.FromConfig(ctx, ccfg.Media, ccfg.WeCom, nil, cbase.Log, cbase.Registry)
		if err != nil || k == nil {
			t.Fatalf("consumer keeper: %v, %v", k, err)
		}
		return media.Wrap(h, k)
	})
	defer pl.close(t)
	resp, err := callbackSender(pl, pcfg).SendEvent(ctx, kf, fake.IssueToken(kf))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	testenv.Eventually(t, 90*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		return testenv.Check(h.read[imgMsg] != nil && h.read[voiceMsg] != nil && h.refused[bigMsg] != "", "the image handled after its DLQ retry, the voice note and the refused file")
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if !bytes.Equal(h.read[imgMsg], img) || !h.retried[imgMsg] {
		t.Errorf("image: read %d bytes (want %d) on a DLQ retry %v (want true)", len(h.read[imgMsg]), len(img), h.retried[imgMsg])
	}
	if h.attempts[imgMsg] < 4 {
		t.Errorf("image handled in %d attempts, want 3 failing + the DLQ retry", h.attempts[imgMsg])
	}
	if !bytes.Equal(h.read[voiceMsg], voice) {
		t.Errorf("voice: read %q, want %q", h.read[voiceMsg], voice)
	}
	for _, id := range []string{imgMsg, voiceMsg, bigMsg} {
		if !h.before[id] {
			t.Errorf("message %s: its media was not in the store when the handler first ran", id)
		}
	}
	if want := "too_large: 102400 bytes, media.max_bytes is 65536"; !bytes.Contains([]byte(h.refused[bigMsg]), []byte(want)) {
		t.Errorf("refusal %q does not say %q", h.refused[bigMsg], want)
	}
	// The DLQ retry came after the expiry and did not need WeChat.
	if n := fake.MediaGets(); n != h.getsAtExpiry || n < 3 {
		t.Errorf("media/get called %d times, %d when the image expired: want no call after (and one per object before)",
			n, h.getsAtExpiry)
	}
}
