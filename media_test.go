package kfpipe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/kfpipe/kfpipe/internal/media"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// TestOpenMedia: a handler's view — Message.Media says what a message
// carries; OpenMedia reads it from the store (keeping it first when no
// stage has), and after WeChat expired it; the errors say why not.
func TestOpenMedia(t *testing.T) {
	const kfID = "wk-open-media"
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{kfID}})
	defer fake.Close()
	kc, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	store, err := media.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k := media.NewKeeper(store, kc, media.KeeperConfig{CorpID: fake.CorpID(), MaxBytes: 4096})
	ctx := media.WithKeeper(context.Background(), k)
	msg := func() *Message {
		all := fake.Messages(kfID)
		return fromChat(all[len(all)-1])
	}

	doc := []byte("%PDF-1.7 a small contract")
	_, id := fake.AddMedia(kfID, "wm-1", MsgFile, "合同.pdf", "application/pdf", doc)
	m := msg()
	ref, ok := m.Media()
	if !ok || ref.Type != MsgFile || ref.MediaID != id {
		t.Fatalf("Media() = %+v, %v; want file %s", ref, ok, id)
	}
	obj, err := OpenMedia(ctx, m) // not kept yet: OpenMedia keeps it
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(obj)
	obj.Close()
	if !bytes.Equal(got, doc) || obj.FileName != "合同.pdf" || obj.ContentType != "application/pdf" || obj.Size != int64(len(doc)) {
		t.Fatalf("OpenMedia: %q %+v", got, obj)
	}
	fake.ExpireMedia(id)
	if obj, err = OpenMedia(ctx, m); err != nil {
		t.Fatalf("OpenMedia after WeChat expired the media: %v", err)
	}
	obj.Close()

	fake.AddMedia(kfID, "wm-1", MsgVideo, "", "video/mp4", make([]byte, 8192))
	if _, err := OpenMedia(ctx, msg()); !errors.Is(err, ErrMediaRefused) {
		t.Fatalf("OpenMedia of 8 KiB with max 4 KiB = %v, want ErrMediaRefused", err)
	}
	_, id = fake.AddImage(kfID, "wm-1", []byte("jpeg"))
	fake.ExpireMedia(id)
	if _, err := OpenMedia(ctx, msg()); !errors.Is(err, ErrMediaExpired) {
		t.Fatalf("OpenMedia of media expired before it was kept = %v, want ErrMediaExpired", err)
	}
	fake.AddText(kfID, "wm-1", "hello")
	if _, ok := msg().Media(); ok {
		t.Fatal("a text message carries media")
	}
	if _, err := OpenMedia(ctx, msg()); !errors.Is(err, ErrNoMedia) {
		t.Fatalf("OpenMedia of a text = %v, want ErrNoMedia", err)
	}
	if _, err := OpenMedia(context.Background(), m); !errors.Is(err, ErrNoMediaStore) {
		t.Fatalf("OpenMedia without a store = %v, want ErrNoMediaStore", err)
	}
}
