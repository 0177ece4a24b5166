package kfpipetest

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kfpipe/kfpipe"
)

// OpenKfID is the customer-service account of the messages the builders
// make.
const OpenKfID = "wk-kfpipetest"

var seq atomic.Int64

// message builds an inbound message as kf-producer reads it from
// sync_msg: Raw is WeChat's item (msgid, send_time, origin, msgtype and
// the type's object), the other fields agree with it.
func message(user string, origin int, servicer, msgType string, body map[string]any) *kfpipe.Message {
	n := seq.Add(1)
	id := fmt.Sprintf("kfpipetest-msg-%d", n)
	now := time.Now().Truncate(time.Second)
	item := map[string]any{"msgid": id, "send_time": now.Unix(), "origin": origin, "msgtype": msgType, msgType: body}
	if msgType == kfpipe.MsgEvent {
		// As in WeChat, an event carries the account and the user inside.
		body["open_kfid"] = OpenKfID
		if user != "" {
			body["external_userid"] = user
		}
	} else {
		item["open_kfid"], item["external_userid"] = OpenKfID, user
	}
	if servicer != "" {
		item["servicer_userid"] = servicer
	}
	raw, err := json.Marshal(item)
	if err != nil {
		panic(fmt.Sprintf("kfpipetest: %v", err))
	}
	return &kfpipe.Message{ID: n, UpstreamMsgID: id, OpenKfID: OpenKfID, ExternalUserID: user, MsgType: msgType,
		Origin: origin, ServicerUserID: servicer, SendTime: now, Raw: raw}
}

// Text is a text message the customer sent.
func Text(user, content string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgText, map[string]any{"content": content})
}

// MenuClick is the customer's tap on the item menuID of a menu the bot
// sent (kf.Menu): a text message with the item's content and its menu_id.
func MenuClick(user, menuID, content string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgText, map[string]any{"content": content, "menu_id": menuID})
}

// ServicerText is a text message a servicer sent user from the WeChat Work
// client (OriginServicer): it reaches the handler too.
func ServicerText(user, servicer, content string) *kfpipe.Message {
	return message(user, kfpipe.OriginServicer, servicer, kfpipe.MsgText, map[string]any{"content": content})
}

// Image is an image the customer sent (its media_id).
func Image(user, mediaID string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgImage, map[string]any{"media_id": mediaID})
}

// Voice is a voice message the customer sent.
func Voice(user, mediaID string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgVoice, map[string]any{"media_id": mediaID})
}

// Video is a video the customer sent.
func Video(user, mediaID string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgVideo, map[string]any{"media_id": mediaID})
}

// File is a file the customer sent.
func File(user, mediaID string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgFile, map[string]any{"media_id": mediaID})
}

// Location is a place the customer shared.
func Location(user, name, address string, latitude, longitude float64) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgLocation, map[string]any{"name": name, "address": address,
		"latitude": latitude, "longitude": longitude})
}

// Link is a link card the customer shared.
func Link(user, title, desc, url string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgLink, map[string]any{"title": title, "desc": desc, "url": url})
}

// BusinessCard is a contact card the customer shared (a WeChat Work
// userid).
func BusinessCard(user, userID string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgBusinessCard, map[string]any{"userid": userID})
}

// MiniProgram is a mini program card the customer shared.
func MiniProgram(user, appID, title, pagePath string) *kfpipe.Message {
	return message(user, kfpipe.OriginCustomer, "", kfpipe.MsgMiniProgram, map[string]any{"appid": appID, "title": title,
		"pagepath": pagePath})
}

// EnterSession is the event of user opening the chat, with a welcome_code
// the handler may answer once with kfpipe.Welcome.
func EnterSession(user, scene, sceneParam string) *kfpipe.Message {
	m := message(user, kfpipe.OriginSystem, "", kfpipe.MsgEvent, map[string]any{"event_type": kfpipe.EventEnterSession,
		"scene": scene, "scene_param": sceneParam, "welcome_code": fmt.Sprintf("kfpipetest-welcome-%d", seq.Add(1))})
	return m
}

// SessionStatusChange is the event of a servicer taking (changeType 1),
// transferring (2), ending (3) or reopening (4) user's session.
func SessionStatusChange(user string, changeType int, oldServicer, newServicer string) *kfpipe.Message {
	return message(user, kfpipe.OriginSystem, "", kfpipe.MsgEvent, map[string]any{"event_type": kfpipe.EventSessionStatusChange,
		"change_type": changeType, "old_servicer_userid": oldServicer, "new_servicer_userid": newServicer})
}

// MsgSendFail is the event of a message to user that was not delivered.
func MsgSendFail(user, failMsgID string, failType int) *kfpipe.Message {
	return message(user, kfpipe.OriginSystem, "", kfpipe.MsgEvent, map[string]any{"event_type": kfpipe.EventMsgSendFail,
		"fail_msgid": failMsgID, "fail_type": failType})
}

// UserRecallMsg is the event of user recalling the message recalledMsgID.
func UserRecallMsg(user, recalledMsgID string) *kfpipe.Message {
	return message(user, kfpipe.OriginSystem, "", kfpipe.MsgEvent, map[string]any{"event_type": kfpipe.EventUserRecallMsg,
		"recall_msgid": recalledMsgID})
}

// ServicerStatusChange is the event of servicer going on duty (status 1)
// or off (2); it concerns no customer (ExternalUserID "").
func ServicerStatusChange(servicer string, status int) *kfpipe.Message {
	return message("", kfpipe.OriginSystem, "", kfpipe.MsgEvent, map[string]any{"event_type": kfpipe.EventServicerStatusChange,
		"servicer_userid": servicer, "status": status})
}
