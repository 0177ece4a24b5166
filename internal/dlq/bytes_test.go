package dlq

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

// realisticChat is a main-topic payload shaped like WeChat's: a text
// message with real-length IDs and the raw item kept as content (about
// 700 bytes, as in the field).
func realisticChat(user string, n int) []byte {
	msgid := fmt.Sprintf("%032x", 0x5eed0000+n)
	item := fmt.Sprintf(`{"msgid":"%s","open_kfid":"wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw","external_userid":"%s","send_time":1764030000,"origin":3,"msgtype":"text","text":{"content":"你好，我想问一下我上周五下的订单什么时候发货？订单号是2026112412345678，收货地址是上海市浦东新区，谢谢！"}}`,
		msgid, user)
	b, _ := chatmsg.Encode(&chatmsg.ChatMessage{MessageID: int64(7_300_000_000_000 + n), UpstreamMsgID: msgid,
		OpenKfID: "wkAJ2GCAAAZSfhHCt7IFSvLKtMPxyJTw", ExternalUserID: user, MsgType: "text", Origin: 3,
		SendTime: 1764030000, ProducedAt: 1764030000123, Content: []byte(item)})
	return b
}

// TestIndexBytesPerLetter indexes 20,000 dead letters of realistic
// messages (400 users, 50 each) into a Redis of its own and measures what
// each costs: used_memory after minus before, divided by the letters.
// The budget is 600 bytes (issue #19); the full letter stayed in the
// index before and cost about 4.4 KB (BENCHMARKS.md, "DLQ index bytes").
func TestIndexBytesPerLetter(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.PrivateRedis(t)})
	defer rdb.Close()
	ctx := context.Background()
	clk := newClock()
	idx := NewIndex(rdb, "kfpipe:", WithClock(clk), WithLetters(mem))
	pol := NewPolicy(testRecovery())
	const letters, users = 20000, 400
	used := func() int64 {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no used_memory in INFO")
		return 0
	}
	before := used()
	size := 0
	for i := range letters {
		user := fmt.Sprintf("wmAJ2GCAAA%022d", i%users)
		at := clk.Now().Add(time.Duration(i) * time.Millisecond)
		v := realisticChat(user, i)
		size = len(v)
		dl := chatmsg.NewDeadLetter(chatmsg.Source{Topic: "qywx-chat-messages", Partition: int32(i % 12), Offset: int64(1_000_000 + i), Timestamp: at,
			Key: []byte(user), Value: v, Headers: []chatmsg.Header{{Key: chatmsg.HeaderMsgType, Value: []byte("text")}}},
			ReasonDownstreamError, "handler: POST http://faq-bot:8080/kf: 503 Service Unavailable", at)
		pol.Place(ctx, dl)
		if _, err := indexDL(t, ctx, idx, dl); err != nil {
			t.Fatal(err)
		}
	}
	per := (used() - before) / letters
	t.Logf("index bytes per dead letter: %d (message %d B, %d letters, %d users)", per, size, letters, users)
	if per > 600 {
		t.Errorf("%d bytes of Redis per dead letter, budget 600", per)
	}
}
