package kfpipe

import "github.com/kfpipe/kfpipe/internal/archive"

// Origins of a message: who wrote it (WeChat's origin field, Message.Origin).
// A bot normally answers OriginCustomer only: a servicer's message reaches
// the handler too (WeChat returns it from sync_msg), and answering it would
// send the customer a reply to their own servicer's words.
const (
	// OriginCustomer is a message the WeChat customer sent.
	OriginCustomer = 3
	// OriginSystem is an event WeChat pushed (MsgType MsgEvent).
	OriginSystem = 4
	// OriginServicer is a message a servicer (接待人员) sent from the WeChat
	// Work client; ServicerUserID names the servicer.
	OriginServicer = 5
	// OriginBot is not WeChat's: it is a History turn that is a reply the
	// bot sent through kfpipe (Reply, Welcome), its MsgID the message it
	// answered.
	OriginBot = archive.OriginBot
)

// Message types: WeChat's msgtype of an inbound message (Message.MsgType).
const (
	MsgText         = "text" // also a tap on a menu item: see Message.MenuID
	MsgImage        = "image"
	MsgVoice        = "voice"
	MsgVideo        = "video"
	MsgFile         = "file"
	MsgLocation     = "location"
	MsgLink         = "link"
	MsgBusinessCard = "business_card"
	MsgMiniProgram  = "miniprogram"
	MsgMenu         = "msgmenu"
	MsgEvent        = "event" // see Message.Event and the Event… constants
)

// Event types: WeChat's event_type of an event message (Event.Type).
const (
	// EventEnterSession: the customer opened the chat; its WelcomeCode
	// lets the handler send one Welcome within 20 seconds.
	EventEnterSession = "enter_session"
	// EventMsgSendFail: a message sent to the customer failed
	// (Event.FailMsgID, Event.FailType).
	EventMsgSendFail = "msg_send_fail"
	// EventServicerStatusChange: a servicer went on or off duty.
	EventServicerStatusChange = "servicer_status_change"
	// EventSessionStatusChange: the session was taken, transferred or
	// ended by a servicer (Event.ChangeType, Old/NewServicerUserID).
	EventSessionStatusChange = "session_status_change"
	// EventUserRecallMsg: the customer recalled a message.
	EventUserRecallMsg = "user_recall_msg"
	// EventServicerRecallMsg: a servicer recalled a message.
	EventServicerRecallMsg = "servicer_recall_msg"
)

// FromCustomer reports whether the customer wrote the message
// (OriginCustomer): the messages a bot answers.
func (m *Message) FromCustomer() bool { return m.Origin == OriginCustomer }

// FromServicer reports whether a servicer wrote the message
// (OriginServicer); ServicerUserID names them.
func (m *Message) FromServicer() bool { return m.Origin == OriginServicer }

// IsEvent reports whether the message is an event (MsgType MsgEvent):
// Event returns its content.
func (m *Message) IsEvent() bool { return m.MsgType == MsgEvent }
