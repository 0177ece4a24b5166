package kfpipetest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
)

// readMedia replies with the media's bytes, or the OpenMedia error's text.
func readMedia(got *[]byte) kfpipe.Handler {
	return kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		obj, err := kfpipe.OpenMedia(ctx, m)
		switch {
		case errors.Is(err, kfpipe.ErrMediaExpired):
			return kfpipe.Reply(ctx, kf.Text{Content: "expired"})
		case errors.Is(err, kfpipe.ErrNoMedia):
			return kfpipe.Reply(ctx, kf.Text{Content: "no media"})
		case err != nil:
			return err
		}
		defer obj.Close()
		*got, err = io.ReadAll(obj)
		if err != nil {
			return err
		}
		return kfpipe.Reply(ctx, kf.Text{Content: obj.ContentType + " " + obj.FileName})
	})
}

func TestMediaReachesTheHandler(t *testing.T) {
	var got []byte
	h := New(t, readMedia(&got))
	data := bytes.Repeat([]byte("voice"), 1000)
	m := h.MediaWith("u1", kfpipe.MsgVoice, "", "audio/amr", data)
	r := h.Run(m).ExpectDone()
	if !bytes.Equal(got, data) {
		t.Fatalf("the handler read %d bytes, want the %d sent", len(got), len(data))
	}
	ref, _ := m.Media()
	r.ExpectTexts("audio/amr " + ref.MediaID + ".amr")

	// Kept before the handler ran: WeChat's expiry does not take it away.
	h.ExpireMedia(m)
	got = nil
	h.Run(m).ExpectDone()
	if !bytes.Equal(got, data) {
		t.Fatalf("after expiry the handler read %d bytes, want the %d kept", len(got), len(data))
	}
	// Never kept and expired: ErrMediaExpired.
	m2 := h.ImageWith("u1", []byte("\xff\xd8\xff\xe0jpeg"))
	h.ExpireMedia(m2)
	h.Run(m2).ExpectDone().ExpectTexts("expired")
	h.Run(Text("u1", "hi")).ExpectDone().ExpectTexts("no media")
}

func TestMediaOverTheBoundIsRefused(t *testing.T) {
	h := New(t, kfpipe.HandlerFunc(func(ctx context.Context, m *kfpipe.Message) error {
		_, err := kfpipe.OpenMedia(ctx, m)
		if !errors.Is(err, kfpipe.ErrMediaRefused) {
			t.Errorf("OpenMedia of a 2,000-byte file with MaxMediaBytes(1000): %v, want ErrMediaRefused", err)
		}
		return nil
	}), MaxMediaBytes(1000))
	h.Run(h.FileWith("u1", "big.bin", make([]byte, 2000))).ExpectDone()
}
