package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/media"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

// photoUser sends the demo's photo after the warm-up: a real PNG through
// the fake WeChat's media/get, which kf-producer's media keeper copies to
// the media store (media.dir in the demo's temporary directory) and the
// handler reads back (the media keeper's store, as kfpipe.OpenMedia does)
// to answer about it. Like the warm-up's, its message and reply are not
// counted in the scenario's figures.
const photoUser = "demo-photo"

// photoAnswer is the handler's answer to the photo.
const photoAnswer = "Thanks for the photo: a %dx%d %s of %d bytes. A colleague will look at it."

// photoPNG is the customer's photo: a 48×32 gradient, encoded as PNG.
func photoPNG() []byte {
	img := image.NewRGBA(image.Rect(0, 0, 48, 32))
	for x := range 48 {
		for y := range 32 {
			img.Set(x, y, color.RGBA{R: uint8(x * 5), G: uint8(y * 8), B: 128, A: 255})
		}
	}
	var b bytes.Buffer
	_ = png.Encode(&b, img)
	return b.Bytes()
}

// photoSeen is what the handler read of the photo.
type photoSeen struct {
	Bytes       int    // read from the media store
	ContentType string // as WeChat served it
	Answer      string // the reply sent ("" none)
	Err         string // why it was not answered
}

// handlePhoto answers the photo from what the media store holds.
func (r *recorder) handlePhoto(ctx context.Context, m *chatmsg.ChatMessage) error {
	seen := photoSeen{}
	defer func() {
		r.mu.Lock()
		r.photo = seen
		r.mu.Unlock()
		r.photoOnce.Do(func() { close(r.photoDone) })
	}()
	k := media.KeeperFrom(ctx)
	ref, ok := media.RefOf("", m)
	if k == nil || !ok {
		seen.Err = "no media store or no media in the message"
		return nil
	}
	rc, info, err := k.Open(ctx, k.Ref(ref.OpenKfID, ref.MsgID, ref.MsgType, ref.MediaID))
	if err != nil {
		seen.Err = err.Error()
		return nil
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return err
	}
	cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		seen.Err = fmt.Sprintf("not an image: %v", err)
		return nil
	}
	seen.Bytes, seen.ContentType = len(data), info.ContentType
	answer := fmt.Sprintf(photoAnswer, cfg.Width, cfg.Height, format, len(data))
	if err := kfpipe.Reply(ctx, kf.Text{Content: answer}); err != nil {
		seen.Err = err.Error()
		return nil
	}
	seen.Answer = answer
	return nil
}

// sendPhoto sends the photo as a customer would and waits for the
// handler's answer.
func sendPhoto(ctx context.Context, fake *wecomtest.Server, sender *wecomtest.CallbackSender, rec *recorder) ([]byte, error) {
	acc := accountName(0)
	data := photoPNG()
	fake.AddMedia(acc, photoUser, "image", "", "image/png", data)
	deadline := time.After(60 * time.Second)
	for {
		if resp, err := sender.SendEvent(ctx, acc, fake.IssueToken(acc)); err == nil {
			resp.Body.Close()
		}
		select {
		case <-rec.photoDone:
			return data, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline:
			return nil, errors.New("the photo was not handled within 60 s")
		case <-time.After(2 * time.Second):
		}
	}
}

// photoSnapshot is what the handler made of the photo.
func (r *recorder) photoSnapshot() photoSeen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.photo
}
