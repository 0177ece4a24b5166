package media

import (
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

const kfID = "wkTESTKF"

// rig is a keeper with a directory store in front of the fake WeChat.
type rig struct {
	fake *wecomtest.Server
	k    *Keeper
	reg  *prometheus.Registry
}

func newRig(t *testing.T, store Store, cfg KeeperConfig) *rig {
	t.Helper()
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{kfID}})
	t.Cleanup(fake.Close)
	kc, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	if store == nil {
		if store, err = NewDirStore(t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	cfg.CorpID = fake.CorpID()
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 1 << 20
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase = time.Millisecond
	}
	reg := prometheus.NewRegistry()
	return &rig{fake: fake, k: NewKeeper(store, kc, cfg, WithRegisterer(reg)), reg: reg}
}

// message returns the chat message of the fake's last message of kfID.
func (r *rig) message(t *testing.T) *chatmsg.ChatMessage {
	t.Helper()
	msgs := r.fake.Messages(kfID)
	return msgs[len(msgs)-1]
}

func (r *rig) kept(stage, result string) float64 {
	return testutil.ToFloat64(r.k.m.kept.WithLabelValues(stage, result))
}

func readAll(t *testing.T, rc io.ReadCloser) []byte {
	t.Helper()
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKeepThenExpire: a kept image is read from the store after WeChat
// expired its media_id, without asking WeChat again.
func TestKeepThenExpire(t *testing.T) {
	r := newRig(t, nil, KeeperConfig{Retries: 2})
	img := bytes.Repeat([]byte("jpeg"), 1000)
	_, mediaID := r.fake.AddImage(kfID, "wmUSER1", img)
	ref, ok := r.k.RefOf(r.message(t))
	if !ok || ref.MediaID != mediaID || ref.MsgType != "image" {
		t.Fatalf("RefOf = %+v, %v; want media_id %s", ref, ok, mediaID)
	}
	info, err := r.k.Keep(context.Background(), "producer", ref)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(img)) || info.ContentType != "image/jpeg" || !strings.HasPrefix(info.FileName, mediaID) {
		t.Fatalf("info = %+v", info)
	}
	r.fake.ExpireMedia(mediaID)
	gets := r.fake.MediaGets()
	if _, err := r.k.Keep(context.Background(), "consumer", ref); err != nil {
		t.Fatalf("Keep of a kept object: %v", err)
	}
	rc, info, err := r.k.Open(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, rc); !bytes.Equal(got, img) {
		t.Fatalf("read %d bytes, want the %d of the image", len(got), len(img))
	}
	if r.fake.MediaGets() != gets {
		t.Fatalf("media/get called %d times after the object was kept", r.fake.MediaGets()-gets)
	}
	if r.kept("producer", "stored") != 1 || r.kept("consumer", "already") != 1 {
		t.Fatalf("kept metrics: producer/stored %v, consumer/already %v", r.kept("producer", "stored"), r.kept("consumer", "already"))
	}
}

// TestExpiredBeforeKept: media WeChat expired before anything kept it is
// ErrExpired, counted, and nothing is stored.
func TestExpiredBeforeKept(t *testing.T) {
	r := newRig(t, nil, KeeperConfig{Retries: 2})
	_, mediaID := r.fake.AddImage(kfID, "wmUSER1", []byte("some image bytes"))
	r.fake.ExpireMedia(mediaID)
	ref, _ := r.k.RefOf(r.message(t))
	if _, err := r.k.Keep(context.Background(), "consumer", ref); !errors.Is(err, ErrExpired) {
		t.Fatalf("Keep = %v, want ErrExpired", err)
	}
	if r.fake.MediaGets() != 1 {
		t.Fatalf("media/get called %d times for an expired id, want 1 (40007 is not retried)", r.fake.MediaGets())
	}
	if _, _, err := r.k.Open(context.Background(), ref); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open = %v, want ErrNotFound", err)
	}
	if r.kept("consumer", "expired") != 1 {
		t.Fatal("expired not counted")
	}
}

// TestTooLargeRefused: an object over max_bytes is refused with a reason
// that names the size and the bound; the refusal is stored, so it is not
// downloaded again.
func TestTooLargeRefused(t *testing.T) {
	r := newRig(t, nil, KeeperConfig{MaxBytes: 1024})
	r.fake.AddMedia(kfID, "wmUSER1", "file", "report.pdf", "application/pdf", make([]byte, 4096))
	ref, _ := r.k.RefOf(r.message(t))
	info, err := r.k.Keep(context.Background(), "producer", ref)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.Refused, "too_large: 4096 bytes, media.max_bytes is 1024") {
		t.Fatalf("Refused = %q", info.Refused)
	}
	_, _, err = r.k.Open(context.Background(), ref)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "4096") {
		t.Fatalf("Open = %v, want ErrRefused with the size", err)
	}
	if _, err := r.k.Keep(context.Background(), "consumer", ref); err != nil || r.fake.MediaGets() != 1 {
		t.Fatalf("second Keep: %v, media/get calls %d (want 1)", err, r.fake.MediaGets())
	}
	if testutil.ToFloat64(r.k.m.refused.WithLabelValues(RefusedTooLarge)) != 1 || r.kept("producer", "refused") != 1 {
		t.Fatal("refusal not counted")
	}
}

// TestFailuresRetriedAndCounted: failures are retried up to Retries and
// each is counted with its reason; when they are exhausted the error says
// the reason and the key.
func TestFailuresRetriedAndCounted(t *testing.T) {
	r := newRig(t, nil, KeeperConfig{Retries: 2})
	r.fake.AddImage(kfID, "wmUSER1", []byte("img"))
	ref, _ := r.k.RefOf(r.message(t))
	r.fake.FailNextMediaGet(2, 40001) // not retryable at kf's level: the keeper retries
	if _, err := r.k.Keep(context.Background(), "producer", ref); err != nil {
		t.Fatalf("Keep after 2 failures with 2 retries: %v", err)
	}
	if got := testutil.ToFloat64(r.k.m.failures.WithLabelValues("producer", "errcode_40001")); got != 2 {
		t.Fatalf("failures counted %v, want 2", got)
	}

	r.fake.AddImage(kfID, "wmUSER2", []byte("img2"))
	ref2, _ := r.k.RefOf(r.message(t))
	r.fake.FailNextMediaGet(3, 40001)
	_, err := r.k.Keep(context.Background(), "consumer", ref2)
	if err == nil || !strings.Contains(err.Error(), "errcode_40001") || !strings.Contains(err.Error(), ref2.MsgID) {
		t.Fatalf("Keep after 3 failures with 2 retries = %v; want the reason and the key", err)
	}
	if r.kept("consumer", "failed") != 1 {
		t.Fatal("failed not counted")
	}
}

// TestStageKeepsAfterProduce: the kf-producer stage queues the media of a
// produced batch, and only once Kafka took it.
func TestStageKeepsAfterProduce(t *testing.T) {
	r := newRig(t, nil, KeeperConfig{Workers: 2, QueueSize: 10})
	r.k.Start()
	defer r.k.Stop(context.Background())
	r.fake.AddImage(kfID, "wmUSER1", []byte("img"))
	m := r.message(t)
	failing := KeepingPublisher(publisherFunc(func([]*chatmsg.ChatMessage) error { return errors.New("kafka down") }), r.k)
	if err := failing.ProduceBatch(context.Background(), "t", []*chatmsg.ChatMessage{m}); err == nil {
		t.Fatal("the publisher's error was lost")
	}
	time.Sleep(50 * time.Millisecond)
	if r.fake.MediaGets() != 0 {
		t.Fatal("media fetched for a batch Kafka did not take")
	}
	ok := KeepingPublisher(publisherFunc(func([]*chatmsg.ChatMessage) error { return nil }), r.k)
	if err := ok.ProduceBatch(context.Background(), "t", []*chatmsg.ChatMessage{m}); err != nil {
		t.Fatal(err)
	}
	ref, _ := r.k.RefOf(m)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := r.k.Store().Stat(context.Background(), mustKey(t, ref)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stage did not keep the media within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type publisherFunc func([]*chatmsg.ChatMessage) error

func (f publisherFunc) ProduceBatch(_ context.Context, _ string, msgs []*chatmsg.ChatMessage) error {
	return f(msgs)
}

func mustKey(t *testing.T, r Ref) string {
	t.Helper()
	k, err := r.Key()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeyRefusesPathParts(t *testing.T) {
	for _, r := range []Ref{{CorpID: "c", OpenKfID: "..", MsgID: "m"}, {CorpID: "c", OpenKfID: "k", MsgID: "a/b"},
		{CorpID: "", OpenKfID: "k", MsgID: "m"}} {
		if _, err := r.Key(); err == nil {
			t.Errorf("Key(%+v) accepted", r)
		}
	}
}

// TestKeepLargeInRanges: a 21 MB video is downloaded in WeChat's 20 MB
// ranges, a transfer broken off mid-range resumed where it stopped, and
// the store holds every byte.
func TestKeepLargeInRanges(t *testing.T) {
	r := newRig(t, nil, KeeperConfig{MaxBytes: 64 << 20})
	video := bytes.Repeat([]byte("0123456789abcdef"), (21<<20)/16)
	_, mediaID := r.fake.AddMedia(kfID, "wmUSER1", "video", "", "video/mp4", video)
	r.fake.CutNextMediaBodies(3 << 20)
	ref, _ := r.k.RefOf(r.message(t))
	info, err := r.k.Keep(context.Background(), "producer", ref)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(video)) {
		t.Fatalf("kept %d bytes, want %d", info.Size, len(video))
	}
	rc, _, err := r.k.Open(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, rc); !bytes.Equal(got, video) {
		t.Fatalf("the store holds %d bytes, not the video's %d", len(got), len(video))
	}
	want := []string{"bytes=0-20971519", "bytes=3145728-24117247"}
	if got := r.fake.MediaRanges(); !reflect.DeepEqual(got, want) {
		t.Fatalf("media/get ranges %q, want %q (media_id %s)", got, want, mediaID)
	}
}
