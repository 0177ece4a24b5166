package media

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
)

// stores returns each Store implementation to run a test against: a
// directory, and a fresh bucket on the real S3-compatible server
// (scripts/s3.sh; skipped without it, failed under CI).
func stores(t *testing.T) map[string]func(t *testing.T) Store {
	return map[string]func(t *testing.T) Store{
		"dir": func(t *testing.T) Store {
			s, err := NewDirStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"s3": func(t *testing.T) Store { return s3Store(t) },
	}
}

func s3Store(t *testing.T) *S3Store {
	t.Helper()
	ep := testenv.S3Endpoint(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := NewS3Store(ctx, S3Config{Endpoint: ep, Bucket: testenv.Bucket(t), AccessKey: testenv.S3AccessKey,
		SecretKey: testenv.S3SecretKey, Prefix: "media/"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStore: every store keeps an object with its info, reads it back
// whole, replaces it whole, and says ErrNotFound for a key it lacks.
func TestStore(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ctx := context.Background()
			key := "wwcorp/wkKF/msg-1"
			if _, err := s.Stat(ctx, key); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Stat of a missing key = %v, want ErrNotFound", err)
			}
			if _, _, err := s.Open(ctx, key); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Open of a missing key = %v, want ErrNotFound", err)
			}
			data := bytes.Repeat([]byte{0xff, 0xd8, 0x00, 0x01}, 5000)
			in := Info{ContentType: "image/jpeg", FileName: "报告 1.jpg", MsgType: "image", MediaID: "in-1",
				Kept: time.Now().UTC().Truncate(time.Second)}
			if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data)), in); err != nil {
				t.Fatal(err)
			}
			info, err := s.Stat(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if info.Size != int64(len(data)) || info.FileName != in.FileName || info.ContentType != in.ContentType ||
				info.MediaID != in.MediaID || !info.Kept.Equal(in.Kept) {
				t.Fatalf("Stat = %+v, want %+v with size %d", info, in, len(data))
			}
			rc, info2, err := s.Open(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, rc); !bytes.Equal(got, data) || info2.Size != info.Size {
				t.Fatalf("Open read %d bytes (info %+v), want %d", len(got), info2, len(data))
			}
			// A refusal record replaces nothing else: another key.
			ref := "wwcorp/wkKF/msg-2"
			if err := s.Put(ctx, ref, strings.NewReader(""), 0, Info{Refused: "too_large: 9 bytes"}); err != nil {
				t.Fatal(err)
			}
			if info, err := s.Stat(ctx, ref); err != nil || info.Refused != "too_large: 9 bytes" || info.Size != 0 {
				t.Fatalf("refusal record: %+v, %v", info, err)
			}
			// Unknown size: read to EOF.
			if err := s.Put(ctx, key, strings.NewReader("new"), -1, Info{ContentType: "text/plain"}); err != nil {
				t.Fatal(err)
			}
			rc, info, err = s.Open(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, rc); string(got) != "new" || info.Size != 3 {
				t.Fatalf("after replace: %q, %+v", got, info)
			}
		})
	}
}

// TestKeeperOnS3: the keeper keeps an image in the real S3 server and
// reads it back after WeChat expired it; a too-large one is refused there.
func TestKeeperOnS3(t *testing.T) {
	r := newRig(t, s3Store(t), KeeperConfig{MaxBytes: 64 << 10, Retries: 1})
	img := bytes.Repeat([]byte("png!"), 4096)
	_, id := r.fake.AddImage(kfID, "wmUSER1", img)
	ref, _ := r.k.RefOf(r.message(t))
	if _, err := r.k.Keep(context.Background(), "producer", ref); err != nil {
		t.Fatal(err)
	}
	r.fake.ExpireMedia(id)
	rc, info, err := r.k.Open(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, rc); !bytes.Equal(got, img) || info.ContentType != "image/jpeg" {
		t.Fatalf("read %d bytes, %+v", len(got), info)
	}
	r.fake.AddMedia(kfID, "wmUSER1", "video", "", "video/mp4", make([]byte, 100<<10))
	big, _ := r.k.RefOf(r.message(t))
	if info, err := r.k.Keep(context.Background(), "producer", big); err != nil || !strings.HasPrefix(info.Refused, RefusedTooLarge) {
		t.Fatalf("Keep of 100 KiB with max 64 KiB: %+v, %v", info, err)
	}
	if _, _, err := r.k.Open(context.Background(), big); !errors.Is(err, ErrRefused) {
		t.Fatalf("Open = %v, want ErrRefused", err)
	}
}
